"""Follow the events table read-only and ship every event, once."""
