"""The HTTP service ``evalstop serve``: the app (:mod:`.app`), its request/response schemas
(:mod:`.schemas`), middleware, Prometheus metrics and background workers (:mod:`.workers`).
Imports FastAPI: keep it out of the core's and the simulator's import path."""
