"""The prompt layers, one module each with its `LayerSpec` (`SPEC`); `stack.BUILTIN_LAYERS` lists the built-ins,
`registry` holds every registered layer in stack order, `stack.default_layers` is the default stack."""
