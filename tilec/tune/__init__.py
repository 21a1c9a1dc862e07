"""Measured tuning: time the cost model's top candidates on the device (`measure`) and keep
the winners per device and kernel (`records`), which compiles then reuse."""
