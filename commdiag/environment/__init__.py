"""Did the settings arrive: check-env, propagation, interpreter probes, detect, doctor."""
