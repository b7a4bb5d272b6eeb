"""herder.toml: the sections (pure data holding every default), their validation, and the
loading of the file. Each importer names the module it needs (`herder.core.settings.sections`,
`.loading`, ...): this package re-exports nothing, so importing a section stays cheap."""
