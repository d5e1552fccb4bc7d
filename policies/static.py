"""Static pinning: the most-requested experts (over the whole trace, or over a
warm-up prefix with static:W) are resident from the start and never evicted;
misses are never admitted. llama.cpp's offload of a fixed expert set."""

NAME = "static"
STRUCTURE = "none"
DOC = "pin the most-requested experts (whole trace, or first W tokens with static:W); never evict, never admit"
