"""In-jail harness. `reference` (trusted: the task's Model) and `candidate` (untrusted: ModelNew) are separate
entry points that always run in separate processes; they exchange only tensors saved in the job directory."""
