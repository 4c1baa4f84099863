"""Test harnesses shipped with the package: simulated clusters and history checkers.

Like ``trio.testing``, these are first-class code: the project's own tests use them, and
users can use them to test code built on tensorhub.
"""
