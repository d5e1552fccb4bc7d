"""The replay's clock of events, shared by the traces that precompute next requests (traces/derived.py,
traces/stream_jit.py) and the policies that read them (policies/belady.py).

Ticks order every event of a replay: step s = t * L + l (token t, MoE layer l) owns the ticks
[s (E + k), (s + 1)(E + k)); its background admissions take s (E + k) + i and its requests
s (E + k) + E + rank."""

import numpy as np

NEVER = np.int64(1) << np.int64(62)  # the next request of an expert that is never requested again
