"""Built-in scorers, one module each (type constant, parameters, factory, class)."""
