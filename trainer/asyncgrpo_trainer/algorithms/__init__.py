"""GRPO math as pure torch functions: advantages and losses. No Ray, no I/O, testable alone."""
