"""A Django project whose tasks run on venturi (see docs/integrations.md)."""
