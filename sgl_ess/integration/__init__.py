"""Engine integrations. Only ``sgl_ess.integration.sglang`` imports SGLang."""
