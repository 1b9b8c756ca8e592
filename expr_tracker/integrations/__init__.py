"""Framework integrations: each module imports its framework lazily (docs/integrations.md)."""
