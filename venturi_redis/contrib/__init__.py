"""Integrations with frameworks (each in its own subpackage, with its own extra).

Nothing in the package's producer side imports these.
"""
