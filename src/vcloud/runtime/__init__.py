"""Runtime support: LUMI environment, pre-flight checks, memory estimates."""
