# The gate of an LMDB environment. LMDB lets transactions run together, but
# growing the map, compacting or closing must run with no transaction at all.
# A transaction's turn is a count changed under the GIL by C code: nothing
# between its check and its change can run another thread or a signal
# handler, so it needs no lock. Only a change of the environment, and the
# turns that wait behind one, take the condition; their waits are timed, so
# that a wake-up lost to an exception inside notify_all (Python code, where
# a signal handler's exception may land) delays them, never stops them.

import threading

cdef extern from "pythread.h":
    unsigned long PyThread_get_thread_ident()

WAKE_UP_SECONDS = 0.05  # the longest a lost wake-up delays a wait for the gate


cdef class Gate:
    """Lets transactions run together (``with gate:``), or one change of the
    environment itself (``with gate.exclusive(what):``) run alone."""

    cdef Py_ssize_t running  # transactions' turns
    cdef bint closed         # a change of the environment runs, or waits for the turns to end
    cdef object changed      # a threading.Condition, for waits only
    cdef dict held           # thread ident -> its turns

    def __cinit__(self):
        self.changed = threading.Condition(threading.Lock())
        self.held = {}

    def __enter__(self):
        """Begin a transaction's turn."""
        cdef unsigned long me = PyThread_get_thread_ident()
        if self.closed:
            with self.changed:
                while self.closed:
                    self.changed.wait(WAKE_UP_SECONDS)
                self.running += 1
        else:
            self.running += 1
        self.held[me] = self.held.get(me, 0) + 1

    def __exit__(self, *exc_info):
        """End a transaction's turn (on any thread: a generator that holds a
        snapshot may be finished on another than the one that began it)."""
        cdef unsigned long me = PyThread_get_thread_ident()
        cdef Py_ssize_t turns = self.held.pop(me, 0) - 1
        if turns > 0:
            self.held[me] = turns
        self.running -= 1
        if self.closed and not self.running:
            with self.changed:
                self.changed.notify_all()

    def held_here(self):
        """Whether this thread is inside a transaction of its own."""
        return PyThread_get_thread_ident() in self.held

    def exclusive(self, what):
        """A context in which no transaction runs: it waits for the running
        ones, and new ones wait for it. ``what`` names it in the error raised
        when this thread holds a transaction (it would wait for itself)."""
        return _Exclusive(self, what)


cdef class _Exclusive:
    cdef Gate gate
    cdef str what

    def __cinit__(self, Gate gate, str what):
        self.gate, self.what = gate, what

    def __enter__(self):
        cdef Gate gate = self.gate
        if gate.held_here():
            raise DatabaseError("cannot %s while this thread holds a read snapshot (an "
                                "unfinished iteration); finish or close it first" % self.what)
        with gate.changed:
            while gate.closed:
                gate.changed.wait(WAKE_UP_SECONDS)
            gate.closed = True
            try:
                while gate.running:
                    gate.changed.wait(WAKE_UP_SECONDS)
            except BaseException:  # (an interrupt) the turns may go on
                gate.closed = False
                gate.changed.notify_all()
                raise

    def __exit__(self, *exc_info):
        cdef Gate gate = self.gate
        with gate.changed:
            gate.closed = False
            gate.changed.notify_all()
