"""The project's own rewards, one module per reward family.

Importing this package registers them (each module decorates its factories with
`register_reward`); `omni_rl.plugins.load_plugins()` does that through the `omni_rl.plugins`
entry point. A new reward module is added to the import list below. Modules that need heavy
packages (OCR engines, CLIP models) import them inside their factories, so importing this
package stays fast.
"""
from rewards import image_stats, jpeg  # noqa: F401  (imported to register)
