# Growing malloc'd arrays, shared by the kernels (_ext) and the Redis kernels
# (_redis).

from libc.stdlib cimport realloc

cdef int grow(void** block, size_t size) except -1 nogil:
    """Resize the malloc'd ``*block`` to ``size`` bytes (MemoryError if it cannot be)."""
    cdef void* grown = realloc(block[0], size)
    if grown == NULL:
        with gil:
            raise MemoryError()
    block[0] = grown
    return 0
