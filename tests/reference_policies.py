"""Plain-Python reference eviction policies, one class per policy, one pool each.

Written for clarity, not speed, and independently of the kernel's arrays: the
numba hooks (policies/*.py) and the replay reference (reference_replay.py) are
checked against these. Every class has the same interface:

- ``o in policy``: is o resident;
- ``hit(o, stamp, request=True)``: resident o is used (a hit, or with
  ``request=False`` a run as a substitute);
- ``insert(o, stamp)``: make the non-resident o resident, evicting per policy
  when the pool is full; returns the victim, None when nothing was evicted, or
  NOT_ADMITTED when the policy refuses o.

``stamp`` orders every use of the replay (recency ties); the list-based policies
keep their own order and ignore it. A miss that is not fetched (substituted,
dropped, computed on the CPU) never reaches the policy: where libCacheSim's
policy learns of a miss at lookup time (ARC's ghost-hit adaptation, S3-FIFO's
ghost removal), that work is done here in ``insert``, which fetch-all calls right
after the miss, so fetch-all streams behave exactly as in libCacheSim.

arc, s3fifo, sieve and clock reproduce libCacheSim 0.3.5 (its C eviction
modules ARC.c, S3FIFO.c, Sieve.c, Clock.c) request for request, with object
size 1 so that capacity counts objects; their lists keep the newest object at
index 0 (libCacheSim's list head) and the oldest at the end (its tail).
"""

from __future__ import annotations

NOT_ADMITTED = "not admitted"


class Policy:
    """A pool of ``capacity`` slots."""

    name = ""

    def __init__(self, capacity: int):
        self.capacity = capacity

    def __contains__(self, o) -> bool:
        raise NotImplementedError

    def __len__(self) -> int:
        raise NotImplementedError

    def hit(self, o, stamp, request: bool = True) -> None:
        raise NotImplementedError

    def insert(self, o, stamp):
        raise NotImplementedError

    def lists(self) -> list[list]:
        """The policy's lists, each newest first, numbered as the numba hooks number them."""
        raise NotImplementedError


# ---------------------------------------------------------------- keyed policies
class Keyed(Policy):
    """Evict the resident object with the smallest key; ties cannot happen (stamps are unique)."""

    def __init__(self, capacity: int):
        super().__init__(capacity)
        self.last_use: dict = {}   # resident object -> stamp of its last use
        self.inserted: dict = {}   # resident object -> stamp of its insertion
        self.count: dict = {}      # resident object -> router requests while cached

    def __contains__(self, o):
        return o in self.last_use

    def __len__(self):
        return len(self.last_use)

    def key(self, o):
        raise NotImplementedError

    def hit(self, o, stamp, request=True):
        self.last_use[o] = stamp
        if request:
            self.count[o] += 1

    def insert(self, o, stamp, exclude=()):
        """``exclude``: objects that may not be the victim (--step-pin: the step's own experts)."""
        victim = None
        if len(self) >= self.capacity:
            victim = min((x for x in self.last_use if x not in exclude), key=self.key)
            for d in (self.last_use, self.inserted, self.count):
                del d[victim]
        self.last_use[o] = stamp
        self.inserted[o] = stamp
        self.count[o] = 1
        return victim


class LRU(Keyed):
    """Least recently used: hits, insertions and substitute runs are uses."""

    name = "lru"

    def key(self, o):
        return self.last_use[o]

    def lists(self):
        return [sorted(self.last_use, key=self.key, reverse=True)]


class FIFO(Keyed):
    """Inserted longest ago; uses do not reorder."""

    name = "fifo"

    def key(self, o):
        return self.inserted[o]

    def lists(self):
        return [sorted(self.inserted, key=self.key, reverse=True)]


class LFU(Keyed):
    """Fewest router requests while cached (1 on insertion, +1 per hit), ties to the least recently used."""

    name = "lfu"

    def key(self, o):
        return (self.count[o], self.last_use[o])


class Freq(Keyed):
    """Lowest request score so far (kept by the replay, resident or not), ties to the least recently used."""

    name = "freq"

    def __init__(self, capacity: int, score: dict):
        super().__init__(capacity)
        self.score = score

    def key(self, o):
        return (self.score[o], self.last_use[o])


class Belady(Keyed):
    """Farthest next request; ``next_use(o)`` gives it as a tuple ((inf,) when never)."""

    name = "belady"

    def __init__(self, capacity: int, next_use):
        super().__init__(capacity)
        self.next_use = next_use

    def key(self, o):
        return (tuple(-x for x in self.next_use(o)), self.last_use[o])


# ------------------------------------------------------------ libCacheSim policies
class Clock(Policy):
    """libCacheSim Clock (FIFO-reinsertion with an n-bit counter).

    A hit raises the object's counter by one while it is below 2^n_bit_counter - 1
    (an init_freq above that cap is kept until evictions lower it); an
    insertion puts the object at the head with counter init_freq. To evict, the
    tail object with a counter >= 1 has it lowered by one and moves to the head;
    the first tail object with counter 0 is the victim."""

    name = "clock"

    def __init__(self, capacity: int, init_freq: int = 0, n_bit_counter: int = 1):
        super().__init__(capacity)
        self.init_freq = int(init_freq)
        self.max_freq = (1 << int(n_bit_counter)) - 1
        self.queue: list = []   # head (newest) first
        self.freq: dict = {}

    def __contains__(self, o):
        return o in self.freq

    def __len__(self):
        return len(self.queue)

    def lists(self):
        return [self.queue]

    def hit(self, o, stamp, request=True):
        if self.freq[o] < self.max_freq:
            self.freq[o] += 1

    def insert(self, o, stamp):
        victim = None
        if len(self.queue) >= self.capacity:
            while self.freq[self.queue[-1]] >= 1:
                x = self.queue.pop()
                self.freq[x] -= 1
                self.queue.insert(0, x)
            victim = self.queue.pop()
            del self.freq[victim]
        self.queue.insert(0, o)
        self.freq[o] = self.init_freq
        return victim


class Sieve(Policy):
    """libCacheSim Sieve.

    A hit sets the object's visited bit; an insertion puts it at the head,
    unvisited. To evict, a hand walks from where it last stopped (the tail at
    first) towards the head, clearing visited bits and wrapping from the head to
    the tail; the first unvisited object is the victim and the hand stays at the
    next newer object (at the tail again once the victim was the head)."""

    name = "sieve"

    def __init__(self, capacity: int):
        super().__init__(capacity)
        self.queue: list = []     # head (newest) first
        self.visited: dict = {}
        self.hand = None          # the object the next eviction starts at; None: the tail

    def __contains__(self, o):
        return o in self.visited

    def __len__(self):
        return len(self.queue)

    def lists(self):
        return [self.queue]

    def hit(self, o, stamp, request=True):
        self.visited[o] = 1

    def insert(self, o, stamp):
        victim = None
        if len(self.queue) >= self.capacity:
            i = len(self.queue) - 1 if self.hand is None else self.queue.index(self.hand)
            while self.visited[self.queue[i]]:
                self.visited[self.queue[i]] = 0
                i = i - 1 if i > 0 else len(self.queue) - 1
            victim = self.queue.pop(i)
            del self.visited[victim]
            self.hand = self.queue[i - 1] if i > 0 else None
        self.queue.insert(0, o)
        self.visited[o] = 0
        return victim


class ARC(Policy):
    """libCacheSim ARC: T1/T2 resident LRU lists, B1/B2 ghost lists, target size p of T1 (a float).

    A hit moves the object to the head of T2. A miss on a B1 ghost raises p by
    max(|B2| / |B1|, 1) (at most the capacity), one on a B2 ghost lowers it by
    max(|B1| / |B2|, 1) (at least 0); the ghost is dropped, the pool (if full)
    evicts by REPLACE, and the object goes to the head of T2. Any other miss
    goes to the head of T1; a full pool first makes room: when |T1| + |B1| =
    capacity, B1 drops its tail and REPLACE evicts (with B1 empty, T1's tail is
    evicted without a ghost), else B2 drops its tail when the four lists hold
    2 x capacity ids, and REPLACE evicts. REPLACE moves T1's tail to B1 when T2
    is empty or T1 is non-empty and |T1| > p (or |T1| = p on a B2 ghost hit),
    else T2's tail to B2."""

    name = "arc"

    def __init__(self, capacity: int):
        super().__init__(capacity)
        self.t1: list = []  # head (most recent) first
        self.t2: list = []
        self.b1: list = []
        self.b2: list = []
        self.p = 0.0
        self.where: dict = {}  # id -> the list holding it

    def __contains__(self, o):
        return self.where.get(o) in ("t1", "t2")

    def __len__(self):
        return len(self.t1) + len(self.t2)

    def lists(self):
        return [self.t1, self.t2, self.b1, self.b2]

    def _move(self, o, src: str | None, dst: str | None):
        if src:
            getattr(self, src).remove(o)
        if dst:
            getattr(self, dst).insert(0, o)
            self.where[o] = dst
        else:
            del self.where[o]

    def _drop_tail(self, name: str):
        self._move(getattr(self, name)[-1], name, None)

    def hit(self, o, stamp, request=True):
        self._move(o, self.where[o], "t2")

    def _replace(self, b2_hit: bool):
        t1 = len(self.t1)
        if (t1 > 0 and (t1 > self.p or (t1 == self.p and b2_hit))) or not self.t2:
            victim = self.t1[-1]
            self._move(victim, "t1", "b1")
        else:
            victim = self.t2[-1]
            self._move(victim, "t2", "b2")
        return victim

    def insert(self, o, stamp):
        c = self.capacity
        full = len(self) >= c
        ghost = self.where.get(o)
        if ghost is not None:  # in B1 or B2
            if ghost == "b1":
                self.p = min(self.p + max(len(self.b2) / len(self.b1), 1.0), float(c))
            else:
                self.p = max(self.p - max(len(self.b1) / len(self.b2), 1.0), 0.0)
            self._move(o, ghost, None)
            victim = self._replace(ghost == "b2") if full else None
            self._move(o, None, "t2")
            return victim
        victim = None
        if full:
            if len(self.t1) + len(self.b1) >= c:
                if self.b1:
                    self._drop_tail("b1")
                    victim = self._replace(False)
                else:
                    victim = self.t1[-1]
                    self._move(victim, "t1", None)
            else:
                if len(self.t1) + len(self.b1) + len(self.t2) + len(self.b2) >= 2 * c and self.b2:
                    self._drop_tail("b2")
                victim = self._replace(False)
        self._move(o, None, "t1")
        return victim


class S3FIFO(Policy):
    """libCacheSim S3FIFO (its current S3FIFO.c, not S3FIFOv0): a small FIFO S of
    int(capacity * small_size_ratio) slots, a main FIFO M of the rest run as a
    2-bit clock, and a ghost FIFO G of int(capacity * ghost_size_ratio) ids.

    A hit adds 1 to the object's frequency. A miss on a ghost id removes it from G
    and inserts the object at M's head; any other miss inserts at S's head, or
    at M's head while S is full and nothing has been evicted yet. Every new entry
    starts at frequency 0. To make room: when M holds more than its share or S
    is empty, M's tail objects with frequency >= 1 go back to M's head with
    min(freq, 3) - 1 until one with 0 is evicted; otherwise S's tail objects with
    frequency >= move_to_main_threshold move to M's head (frequency 0) until one
    below it is evicted into G's head (G dropping its tail when full), and if S
    empties first, M evicts as above. libCacheSim refuses an object as large as
    S: with int(capacity * small_size_ratio) <= 1 nothing is ever admitted (and
    libCacheSim 0.3.5 refuses to build the cache when it is 0)."""

    name = "s3fifo"

    def __init__(self, capacity: int, small_size_ratio: float = 0.1, ghost_size_ratio: float = 0.9,
                 move_to_main_threshold: int = 2):
        super().__init__(capacity)
        self.small_cap = int(capacity * small_size_ratio)
        self.main_cap = capacity - self.small_cap
        self.ghost_cap = int(capacity * ghost_size_ratio)
        self.threshold = move_to_main_threshold
        self.small: list = []   # head (newest) first
        self.main: list = []
        self.ghost: list = []
        self.in_ghost: set = set()
        self.freq: dict = {}
        self.has_evicted = False

    def __contains__(self, o):
        return o in self.freq

    def __len__(self):
        return len(self.small) + len(self.main)

    def lists(self):
        return [self.small, self.main, self.ghost]

    def hit(self, o, stamp, request=True):
        self.freq[o] += 1

    def _evict_main(self):
        while True:
            x = self.main.pop()
            if self.freq[x] >= 1:
                self.main.insert(0, x)
                self.freq[x] = min(self.freq[x], 3) - 1
            else:
                del self.freq[x]
                return x

    def _evict(self):
        self.has_evicted = True
        if len(self.main) <= self.main_cap and self.small:
            while self.small:
                x = self.small.pop()
                if self.freq[x] >= self.threshold:
                    self.main.insert(0, x)
                    self.freq[x] = 0
                else:
                    del self.freq[x]
                    if self.ghost_cap > 0:
                        if len(self.ghost) >= self.ghost_cap:
                            self.in_ghost.remove(self.ghost.pop())
                        self.ghost.insert(0, x)
                        self.in_ghost.add(x)
                    return x
        return self._evict_main()

    def insert(self, o, stamp):
        if o in self.in_ghost:
            self.ghost.remove(o)
            self.in_ghost.remove(o)
            victim = self._evict() if len(self) >= self.capacity else None
            self.main.insert(0, o)
        else:
            if self.small_cap <= 1:
                return NOT_ADMITTED
            victim = self._evict() if len(self) >= self.capacity else None
            if not self.has_evicted and len(self.small) >= self.small_cap:
                self.main.insert(0, o)
            else:
                self.small.insert(0, o)
        self.freq[o] = 0
        return victim


LIBCACHESIM = {"arc": ARC, "s3fifo": S3FIFO, "sieve": Sieve, "clock": Clock}


def make_policy(name: str, capacity: int, params: dict | None = None, *, score=None, next_use=None) -> Policy:
    """One pool's policy by eviction name; ``score``/``next_use`` are what freq/belady read."""
    if name == "lru":
        return LRU(capacity)
    if name == "fifo":
        return FIFO(capacity)
    if name == "lfu":
        return LFU(capacity)
    if name == "freq":
        return Freq(capacity, score)
    if name == "belady":
        return Belady(capacity, next_use)
    return LIBCACHESIM[name](capacity, **(params or {}))
