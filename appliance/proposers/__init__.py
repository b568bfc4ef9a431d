"""Proposers: where new candidate sources come from (the LLM, the parameter tuner, a person)."""
