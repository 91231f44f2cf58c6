"""Values shared by every layer: names, errors, hashing, configuration. No I/O here."""
