"""Models a user brings with model=custom model.entry=..., for tests."""
