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

import math

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



def default_token(stamp) -> int:
    """The token of a use when each event of a one-pool stream is a token of its own (tests/policy_streams.py);
    the replay reference passes its own (stamp[0] // L)."""
    return stamp if stamp >= 0 else -1


class LFUDA(Keyed):
    """LFU with dynamic aging (Arlitt et al. 2000): key = requests while cached + L, L the last victim's key
    (0 at the start); a request hit recomputes the key with the current L, an insertion gets 1 + L; lowest key
    evicted, ties to the least recently used (a run as a substitute refreshes recency only)."""

    name = "lfuda"

    def __init__(self, capacity: int):
        super().__init__(capacity)
        self.age = 0
        self.k: dict = {}

    def key(self, o):
        return (self.k[o], self.last_use[o])

    def hit(self, o, stamp, request=True):
        super().hit(o, stamp, request)
        if request:
            self.k[o] = self.count[o] + self.age

    def insert(self, o, stamp, exclude=()):
        if len(self) >= self.capacity:
            self.age = self.k[min(self.last_use, key=self.key)]
        victim = super().insert(o, stamp, exclude)
        if victim is not None:
            del self.k[victim]
        self.k[o] = 1 + self.age
        return victim


class LCP(Keyed):
    """mlx-flash's LCP (lcp_cache.py LCPCache): lowest frequency x base^(tokens since last use / decay), the
    frequency 1 on insertion and +1 per request hit, the last use the token of the insertion or last request
    hit; ties to the earliest inserted. Compared through the time-invariant log key the kernel uses
    (policies/lcp.py), computed with the same floating-point operations."""

    name = "lcp"

    def __init__(self, capacity: int, base: float = 0.25, decay_tokens: float = 128.0, token=default_token):
        super().__init__(capacity)
        self.base, self.decay, self.token = base, decay_tokens, token
        self.last_token: dict = {}

    def key(self, o):
        k = float(self.last_token[o]) + self.decay / math.log2(1.0 / self.base) * math.log2(float(self.count[o]))
        return (k, self.inserted[o])

    def hit(self, o, stamp, request=True):
        if request:  # a run as a substitute changes nothing
            self.count[o] += 1
            self.last_token[o] = self.token(stamp)

    def insert(self, o, stamp, exclude=()):
        victim = super().insert(o, stamp, exclude)
        if victim is not None:
            del self.last_token[victim]
        self.last_token[o] = self.token(stamp)
        return victim


class LFRU(Policy):
    """colibri's LFRU score (c/tier.h tier_lfru_score) as an eviction: lowest heat, then least recently
    requested; heat counts the requests the policy sees (hits, fetched misses), kept across evictions, halved
    at every multiple of decay_tokens tokens after the pool's first request (0: never). A run as a
    substitute changes nothing."""

    name = "lfru"

    def __init__(self, capacity: int, decay_tokens: float = 0.0, token=default_token):
        super().__init__(capacity)
        self.period, self.token = int(decay_tokens), token
        self.heat: dict = {}
        self.last: dict = {}  # resident -> stamp of its last request
        self.epoch = 0        # the period of the last request + 1; 0: none yet

    def __contains__(self, o):
        return o in self.last

    def __len__(self):
        return len(self.last)

    def _decay(self, stamp):
        tok = self.token(stamp)
        if self.period <= 0 or tok < 0:
            return
        epoch = tok // self.period + 1
        if self.epoch == 0:
            self.epoch = epoch
            return
        if epoch > self.epoch:
            shift = min(epoch - self.epoch, 31)
            self.epoch = epoch
            for x in self.heat:
                self.heat[x] >>= shift

    def hit(self, o, stamp, request=True):
        if request:
            self._decay(stamp)
            self.heat[o] += 1
            self.last[o] = stamp

    def insert(self, o, stamp):
        self._decay(stamp)
        self.heat[o] = self.heat.get(o, 0) + 1
        victim = None
        if len(self) >= self.capacity:
            victim = min(self.last, key=lambda x: (self.heat[x], self.last[x]))
            del self.last[victim]
        self.last[o] = stamp
        return victim


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


class SLRU(Policy):
    """libCacheSim SLRU: n_seg LRU segments of capacity // n_seg slots each (segment 0 the lowest).

    A hit in the top segment moves the object to its head; a hit below moves it to the head of the
    next segment up, and a segment over its size cools: its tail goes to the head of the segment
    below, cascading down; a cooled segment 0 evicts its tail (an eviction on a hit). An insertion
    goes to the head of the lowest segment with room; when none has room it goes to segment 0 (which
    then holds more than its share: capacity % n_seg slots are only ever used by segment 0). A full
    pool evicts the tail of the lowest non-empty segment first. With capacity < n_seg every segment
    has no slot and nothing is admitted."""

    name = "slru"

    def __init__(self, capacity: int, n_seg: int = 4):
        super().__init__(capacity)
        self.n_seg = int(n_seg)
        self.seg_cap = capacity // self.n_seg
        self.segs: list[list] = [[] for _ in range(self.n_seg)]  # head (newest) first
        self.where: dict = {}
        self.extra_victims: list = []  # objects evicted while a hit cooled the segments

    def __contains__(self, o):
        return o in self.where

    def __len__(self):
        return len(self.where)

    def lists(self):
        return self.segs

    def _evict(self):
        seg = next(s for s in self.segs if s)
        x = seg.pop()
        del self.where[x]
        return x

    def _cool(self, i: int):
        if i == 0:
            self.extra_victims.append(self._evict())
            return
        x = self.segs[i].pop()
        self.segs[i - 1].insert(0, x)
        self.where[x] = i - 1
        while len(self.segs[i - 1]) > self.seg_cap:
            self._cool(i - 1)

    def hit(self, o, stamp, request=True):
        i = self.where[o]
        self.segs[i].remove(o)
        if i == self.n_seg - 1:
            self.segs[i].insert(0, o)
            return
        self.segs[i + 1].insert(0, o)
        self.where[o] = i + 1
        while len(self.segs[i + 1]) > self.seg_cap:
            self._cool(i + 1)

    def insert(self, o, stamp):
        if self.seg_cap < 1:
            return NOT_ADMITTED
        victim = None
        while len(self) + 1 > self.capacity:
            assert victim is None
            victim = self._evict()
        i = next((i for i, s in enumerate(self.segs) if len(s) + 1 <= self.seg_cap), 0)
        self.segs[i].insert(0, o)
        self.where[o] = i
        return victim


class TwoQ(Policy):
    """libCacheSim TwoQ: a FIFO Ain of int(capacity * a_in_size_ratio) slots, an LRU Am of the rest
    and a ghost FIFO Aout of int(capacity * a_out_size_ratio) ids.

    A hit in Am moves the object to Am's head; a hit in Ain changes nothing. A miss on an Aout id
    drops the ghost; the object then goes to Am's head (Am evicting its own tail when Am is full),
    any other one to Ain's head (Ain may exceed its share). A full pool first evicts: Am's tail when
    Am is non-empty and Ain holds at most its share, else Ain's tail, whose id enters Aout's head
    (Aout dropping its tail when full). With no Ain slot (capacity < 4 at the defaults) nothing is
    admitted."""

    name = "twoq"

    def __init__(self, capacity: int, a_in_size_ratio: float = 0.25, a_out_size_ratio: float = 0.5):
        super().__init__(capacity)
        self.ain_cap = int(capacity * a_in_size_ratio)
        self.aout_cap = int(capacity * a_out_size_ratio)
        self.am_cap = capacity - self.ain_cap
        self.ain: list = []   # head (newest) first
        self.am: list = []
        self.aout: list = []

    def __contains__(self, o):
        return o in self.ain or o in self.am

    def __len__(self):
        return len(self.ain) + len(self.am)

    def lists(self):
        return [self.ain, self.am, self.aout]

    def hit(self, o, stamp, request=True):
        if o in self.am:
            self.am.remove(o)
            self.am.insert(0, o)

    def _evict(self):
        if self.am and len(self.ain) <= self.ain_cap:
            return self.am.pop()
        x = self.ain.pop()
        if self.aout_cap >= 1:
            while len(self.aout) + 1 > self.aout_cap:
                self.aout.pop()
            self.aout.insert(0, x)
        return x

    def insert(self, o, stamp):
        ghost = o in self.aout
        if ghost:
            self.aout.remove(o)
        if self.ain_cap < 1:
            return NOT_ADMITTED
        victim = None
        while len(self) + 1 > self.capacity:
            assert victim is None
            victim = self._evict()
        if ghost:
            while len(self.am) + 1 > self.am_cap:
                assert victim is None
                victim = self.am.pop()
            self.am.insert(0, o)
        else:
            self.ain.insert(0, o)
        return victim


class LRUK(Policy):
    """libCacheSim LRUK: each cached object's last k uses (kept while it is cached). Objects used fewer
    than k times since their insertion wait in a FIFO and are evicted first, oldest insertion first;
    the others are evicted by the oldest k-th most recent use. k = 1 is LRU."""

    name = "lruk"

    def __init__(self, capacity: int, k: int = 2):
        super().__init__(capacity)
        self.k = int(k)
        self.fifo: list = []   # head (newest insertion) first
        self.hist: dict = {}   # cached object -> its last k use stamps, oldest first
        self.kth: dict = {}    # object with k uses -> its k-th most recent use stamp

    def __contains__(self, o):
        return o in self.hist

    def __len__(self):
        return len(self.hist)

    def lists(self):
        return [self.fifo]

    def hit(self, o, stamp, request=True):
        h = self.hist[o]
        h.append(stamp)
        if len(h) > self.k:
            h.pop(0)
        if o in self.kth or len(h) >= self.k:
            if o not in self.kth:
                self.fifo.remove(o)
            self.kth[o] = h[0]

    def insert(self, o, stamp):
        victim = None
        if len(self) >= self.capacity:
            if self.fifo:
                victim = self.fifo.pop()
            else:
                victim = min(self.kth, key=self.kth.get)
                del self.kth[victim]
            del self.hist[victim]
        self.hist[o] = [stamp]
        if self.k == 1:
            self.kth[o] = stamp
        else:
            self.fifo.insert(0, o)
        return victim


class MQ(Policy):
    """libCacheSim MQ (Zhou et al.'s multi-queue): n_queue LRU queues, an object with frequency f in
    queue min(floor(log2 f), n_queue - 1), and a ghost FIFO Qout of int(capacity * qout_size_ratio)
    ids that remembers an evicted object's frequency.

    A virtual clock advances by one at every hit and insertion. A hit adds 1 to the frequency and moves
    the object to the head of its queue with an expiry lifetime ticks ahead; an insertion starts at
    frequency 1, or one more than the frequency remembered in Qout (whose id is dropped). After either,
    each queue above the lowest whose tail has expired sends it to the head of the queue below with a
    fresh expiry. A full pool evicts the tail of the lowest non-empty queue into Qout's head (Qout
    dropping its tail when full)."""

    name = "mq"

    def __init__(self, capacity: int, n_queue: int = 8, lifetime: int = 10000, qout_size_ratio: float = 4.0):
        super().__init__(capacity)
        self.n = int(n_queue)
        self.lifetime = int(lifetime)
        self.qout_cap = int(capacity * qout_size_ratio)
        self.queues: list[list] = [[] for _ in range(self.n)]  # head (most recent) first
        self.qout: list = []
        self.where: dict = {}    # resident object -> its queue
        self.freq: dict = {}     # resident object or ghost -> frequency
        self.expire: dict = {}
        self.vtime = 0

    def __contains__(self, o):
        return o in self.where

    def __len__(self):
        return len(self.where)

    def lists(self):
        return self.queues + [[] for _ in range(8 - self.n)] + [self.qout]  # Qout is the hooks' list 8

    def _qnum(self, f: int) -> int:
        q = 0
        while f > 1 and q < self.n - 1:
            f >>= 1
            q += 1
        return q

    def _link(self, o, q):
        self.queues[q].insert(0, o)
        self.where[o] = q

    def _adjust(self):
        self.vtime += 1
        for q in range(1, self.n):
            if self.queues[q]:
                x = self.queues[q][-1]
                if self.expire[x] < self.vtime:
                    self.queues[q].pop()
                    self._link(x, q - 1)
                    self.expire[x] = self.vtime + self.lifetime

    def hit(self, o, stamp, request=True):
        self.queues[self.where[o]].remove(o)
        self.freq[o] = min(self.freq[o] + 1, 2**31 - 1)
        self._link(o, self._qnum(self.freq[o]))
        self.expire[o] = self.vtime + self.lifetime
        self._adjust()

    def insert(self, o, stamp):
        ghost = o in self.qout
        if ghost:
            self.qout.remove(o)
        victim = None
        if len(self) >= self.capacity:
            victim = next(q for q in self.queues if q).pop()
            del self.where[victim]
            del self.expire[victim]
            if self.qout_cap >= 1:
                while len(self.qout) + 1 > self.qout_cap:
                    del self.freq[self.qout.pop()]
                self.qout.insert(0, victim)
            else:
                del self.freq[victim]
        self.freq[o] = min(self.freq[o] + 1, 2**31 - 1) if ghost else 1
        self._link(o, self._qnum(self.freq[o]))
        self.expire[o] = self.vtime + self.lifetime
        self._adjust()
        return victim


class CAR(Policy):
    """libCacheSim CAR (Bansal & Modha's clock with adaptive replacement): clocks T1 and T2 of resident
    objects (newest first, the hand at the oldest), LRU ghost lists B1 and B2, and p, T1's target size.

    A hit sets the object's reference bit. A miss on a B1 ghost raises p by max(1, |B2| // |B1|) (integer
    division; at most the capacity), one on a B2 ghost lowers it by max(1, |B1| // |B2|) (at least 0); the
    ghost is dropped and the object enters T2, any other one T1, unreferenced. A full pool first replaces:
    while |T1| >= max(1, p), T1's oldest moves to B1's head if unreferenced (the victim), else loses its bit
    and joins T2 as its newest; otherwise T2's oldest moves to B2's head if unreferenced, else loses its bit
    and becomes T2's newest. Then, when |T1| + |B1| >= capacity, B1 drops its oldest. B2 is never trimmed
    (libCacheSim's condition for it cannot hold)."""

    name = "car"

    def __init__(self, capacity: int):
        super().__init__(capacity)
        self.t1: list = []  # newest first
        self.t2: list = []
        self.b1: list = []
        self.b2: list = []
        self.p = 0.0
        self.ref: dict = {}

    def __contains__(self, o):
        return o in self.ref

    def __len__(self):
        return len(self.t1) + len(self.t2)

    def lists(self):
        return [self.t1, self.t2, self.b1, self.b2]

    def hit(self, o, stamp, request=True):
        self.ref[o] = True

    def _replace(self):
        while True:
            if len(self.t1) >= max(1.0, self.p):
                x = self.t1.pop()
                if not self.ref[x]:
                    del self.ref[x]
                    self.b1.insert(0, x)
                    return x
                self.ref[x] = False
                self.t2.insert(0, x)
            else:
                x = self.t2.pop()
                if not self.ref[x]:
                    del self.ref[x]
                    self.b2.insert(0, x)
                    return x
                self.ref[x] = False
                self.t2.insert(0, x)

    def insert(self, o, stamp):
        c = self.capacity
        ghost = o in self.b1 or o in self.b2
        if o in self.b1:
            self.p = min(self.p + max(1, len(self.b2) // len(self.b1)), float(c))
            self.b1.remove(o)
        elif o in self.b2:
            self.p = max(self.p - max(1, len(self.b1) // len(self.b2)), 0.0)
            self.b2.remove(o)
        victim = None
        if len(self) >= c:
            victim = self._replace()
            if len(self.t1) + len(self.b1) >= c:
                self.b1.pop()
        (self.t2 if ghost else self.t1).insert(0, o)
        self.ref[o] = False
        return victim


class LIRS(Policy):
    """libCacheSim LIRS, transliterated from its LIRS.c: three LRU lists, S (the LIRS stack: LIR objects,
    and HIR objects resident or not, list 0), Q (resident HIR objects, list 1) and NH (the non-resident
    HIR objects of S, list 2), with hirs_limit = max(1, int(0.01 * capacity)) and lirs_limit = capacity -
    hirs_limit. Each S entry carries its own LIR and resident flags.

    Every lookup first moves the object to S's head and to Q's head where it is in them. A hit on a LIR
    object prunes S (non-LIR entries leave S's bottom, the head excepted). A hit on a resident HIR object
    of S drops its Q entry and makes it LIR (demoting S's bottom LIR into Q first while the LIR set is
    full). A hit on a Q object not in S demotes while the LIR set is full and enters it in S as a resident
    HIR object. A miss on a non-resident HIR object of S demotes while the LIR set is full, leaves NH and
    becomes LIR; any other miss becomes LIR while the LIR set has room, else a resident HIR object of S
    and Q (Q evicting its LRU first when full). Demoting S's bottom LIR puts it at Q's head (Q evicting
    first when full) and prunes S; evicting Q's LRU marks its S entry non-resident and enters it in NH.
    After each request, while S holds more than 2 x capacity entries, NH's oldest leaves S and NH.

    libCacheSim's quirks are kept: a hit on a Q object not in S demotes a LIR object although the hit one
    stays HIR, and with hirs_limit = 1 that demotion evicts the hit object itself from Q while it becomes a
    resident entry of S that no count includes, so the pool holds more objects than its capacity until such
    an entry is hit (then counted as LIR), demoted (into Q) or pruned (evicted). Evictions happen on hits
    and an insertion can evict more than one object: the first is the insertion's victim, every other one
    is appended to ``extra_victims``. One difference: at 2 slots libCacheSim can demote a non-resident
    entry from S's bottom into Q, leaving its NH entry behind (a stale entry whose later removal can drop
    another S entry); here the NH entry goes with it."""

    name = "lirs"

    def __init__(self, capacity: int):
        super().__init__(capacity)
        self.hirs_limit = max(1, int(0.01 * capacity))
        self.lirs_limit = capacity - self.hirs_limit
        self.s: list = []    # head (most recent) first
        self.q: list = []
        self.nh: list = []
        self.lir: dict = {}  # S entry -> is LIR
        self.res: dict = {}  # S entry -> resident
        self.lirs_count = self.hirs_count = self.occupied = 0
        self.extra_victims: list = []  # evictions beyond an insertion's victim (on hits, by pruning)
        self._lost: list = []  # residents evicted by the operation in progress, in order

    def __contains__(self, o):
        if o in self.lir:
            return self.lir[o] or self.res[o]
        return o in self.q

    def __len__(self):
        return sum(1 for o in set(self.s) | set(self.q) if o in self)

    def lists(self):
        return [self.s, self.q, self.nh]

    @staticmethod
    def _to_head(lst, o):
        lst.remove(o)
        lst.insert(0, o)

    def _s_drop_tail(self):
        x = self.s.pop()
        del self.lir[x], self.res[x]
        return x

    def _prune(self):
        while len(self.s) >= 2:
            x = self.s[-1]
            if self.lir[x]:
                break
            if not self.res[x] and x in self.nh:
                self.nh.remove(x)
            was = x in self
            self._s_drop_tail()
            if was and x not in self:  # the uncounted resident of the quirk: evicted silently
                self._lost.append(x)

    def _evict_hir(self):
        x = self.q.pop()
        self.hirs_count -= 1
        if x in self.lir:
            self.res[x] = False
            assert x not in self.nh
            self.nh.insert(0, x)
        self.occupied -= 1
        if x not in self:
            self._lost.append(x)

    def _evict_lir(self):
        # S's bottom, LIR or not (the uncounted resident of the quirk below can be there): still counted as one
        # LIR leaving, as libCacheSim does
        x = self._s_drop_tail()
        if x in self.nh:  # a non-resident entry (seen at 2 slots only): libCacheSim leaves a stale NH entry behind
            self.nh.remove(x)
        self.lirs_count -= 1
        self.occupied -= 1
        while self.hirs_count + 1 > self.hirs_limit:
            self._evict_hir()
        assert x not in self.q
        self.q.insert(0, x)
        self.hirs_count += 1
        self.occupied += 1
        self._prune()

    def _limit_stack(self):
        while len(self.s) > 2 * self.capacity and self.nh:
            x = self.nh.pop()
            if x in self.lir:
                self.s.remove(x)
                del self.lir[x], self.res[x]

    def _lookup(self, o):
        """The lookup's moves; the kind of object o is: "lir", "hir_s" (resident HIR in S), "hir_q" (in Q
        only), "nonres" (non-resident HIR in S) or None."""
        in_s, in_q = o in self.lir, o in self.q
        if in_s:
            self._to_head(self.s, o)
        if in_q:
            self._to_head(self.q, o)
        if in_s:
            return "lir" if self.lir[o] else ("hir_s" if self.res[o] else "nonres")
        return "hir_q" if in_q else None

    def hit(self, o, stamp, request=True):
        kind = self._lookup(o)
        self._lost = []
        if kind == "lir":
            self._prune()
        elif kind == "hir_s":
            if o in self.q:
                self.q.remove(o)
                self.hirs_count -= 1
                self.occupied -= 1
            while self.lirs_count + 1 > self.lirs_limit:
                self._evict_lir()
            self.lir[o] = True
            self.lirs_count += 1
            self.occupied += 1
        else:
            assert kind == "hir_q"
            while self.lirs_count + 1 > self.lirs_limit:
                self._evict_lir()
            assert o not in self.lir
            self.s.insert(0, o)
            self.lir[o], self.res[o] = False, True
            if o in self._lost:  # evicted from Q by its own demotion, resident again in S
                self._lost.remove(o)
        self._limit_stack()
        self.extra_victims += self._lost

    def _kind(self, o):
        """The kind of o (as _lookup), without moving it."""
        if o in self.lir:
            return "lir" if self.lir[o] else ("hir_s" if self.res[o] else "nonres")
        return "hir_q" if o in self.q else None

    def insert(self, o, stamp):
        kind = self._lookup(o)
        self._lost = []
        if kind == "nonres":  # LIRS_can_insert
            while self.lirs_count + 1 > self.lirs_limit:
                self._evict_lir()
            if o in self.nh:
                self.nh.remove(o)
        else:
            assert kind is None, "libCacheSim aborts here"
            if self.lirs_limit < 1:  # an object larger than the LIR share: not admitted
                self._limit_stack()
                return NOT_ADMITTED
            if self.lirs_count + 1 > self.lirs_limit and self.hirs_count + 1 > self.hirs_limit:
                while self.hirs_count + 1 > self.hirs_limit:
                    self._evict_hir()
        while self.occupied + 1 > self.capacity:  # cache_get_base's loop over LIRS_evict
            before = (self.occupied, len(self.q), len(self.s))
            kind = self._kind(o)
            if kind == "nonres":
                while self.hirs_count >= self.hirs_limit:
                    self._evict_hir()
                self._evict_lir()
            elif kind is None and self.lirs_count + 1 > self.lirs_limit \
                    and self.hirs_count + 1 > self.hirs_limit:
                self._evict_hir()
            assert before != (self.occupied, len(self.q), len(self.s)), "libCacheSim would loop forever"
        kind = self._kind(o)  # LIRS_insert
        if kind == "nonres":
            self.lir[o], self.res[o] = True, True
            self.lirs_count += 1
        else:
            assert kind is None
            self.s.insert(0, o)
            if self.lirs_count + 1 <= self.lirs_limit:
                self.lir[o], self.res[o] = True, True
                self.lirs_count += 1
            else:
                self.lir[o], self.res[o] = False, True
                self.q.insert(0, o)
                self.hirs_count += 1
        self.occupied += 1
        self._limit_stack()
        self.extra_victims += self._lost[1:]
        return self._lost[0] if self._lost else None


LIBCACHESIM = {"arc": ARC, "s3fifo": S3FIFO, "sieve": Sieve, "clock": Clock, "slru": SLRU, "twoq": TwoQ,
               "lruk": LRUK, "mq": MQ, "car": CAR, "lirs": LIRS}


ENGINES = {"lfuda": LFUDA, "lcp": LCP, "lfru": LFRU}  # evictions engines run (no libCacheSim twin)
TOKEN_TIMED = ("lcp", "lfru")  # their time is in tokens


def make_policy(name: str, capacity: int, params: dict | None = None, *, score=None, next_use=None,
                token=None) -> Policy:
    """One pool's policy by eviction name; ``score``/``next_use`` are what freq/belady read, ``token`` the token of
    a use's stamp (lcp, lfru; default: each event its own token)."""
    if name in ENGINES:
        extra = {"token": token} if token is not None and name in TOKEN_TIMED else {}
        return ENGINES[name](capacity, **(params or {}), **extra)
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
