"""The project's tools and environments for agentic runs (`agent:` in a config), one module each.

`import agent_tools` imports every module of this package, so a new tool registers itself
(`omni_rl.agent.register_tool` / `register_environment`) with no second edit;
`omni_rl.plugins.load_plugins()` does that through the `omni_rl.plugins` entry point. Modules
that need heavy models (the `draw` tool's diffusion model, the `judge`'s reward) load them on
first call, so importing this package stays fast. `images` is a helper (it registers nothing).
"""
from omni_rl.plugins import import_package_modules

HELPERS = ("images",)

import_package_modules(__name__, __path__, HELPERS)
