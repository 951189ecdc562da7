"""HTTP emulators of the source DAMs (Rosetta, OTMM) for testing connectors over real HTTP.

FAST_RETRY is the retry policy tests give connectors: the same loop as production, with delays of
hundredths of a second so that injected faults cost no wall-clock time.
"""

FAST_RETRY = {"max_attempts": 4, "backoff_base_seconds": 0.01, "backoff_max_seconds": 0.05,
              "connect_timeout_seconds": 2, "read_timeout_seconds": 2}
