"""Writing an environment: conformance checks, scaffolding, test helpers, data generators, schemas."""
