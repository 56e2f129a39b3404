"""The planner's view of each adapter (`omni_rl.plan.spec`), one file per adapter:
`adapters/plan/<model>.py` builds the network of `adapters/<model>.py` from configs alone and gives
the inputs of one traced forward."""
