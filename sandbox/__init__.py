"""The only code that runs next to untrusted candidates: the jail and the in-jail harness.

Imports nothing from `appliance`: the controller depends on the sandbox, never the other way round."""
