"""The prompt layers, one module each; `stack.default_layers` is the default stack."""
