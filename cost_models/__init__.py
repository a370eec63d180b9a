"""Pure cost models: specs in, numbers out. No I/O, no torch."""
