"""capture_core: record every model call of a rollout at the model-server boundary."""
