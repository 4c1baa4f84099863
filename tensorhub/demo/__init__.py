"""The runnable demonstration behind ``make demo`` (``tensorhub demo``)."""
