"""Pure, synchronous, deterministic protocol logic.

Nothing here imports asyncio, socket, time, random, torch or uvloop (a test enforces it):
time and randomness are inputs, and effects are returned as data, so the same code runs
under the asyncio driver and under the simulator's virtual clock.
"""
