/* The values within a Hamming distance of a probe, compared one by one (the
   native engine's recent): with the CPU's popcnt instruction where it has
   one, which a build for any x86-64 may not assume. */
#ifndef SIMHASHDB_NEAR_H
#define SIMHASHDB_NEAR_H

#include <stddef.h>
#include <stdint.h>

#define NEAR_VALUES_BODY                                                   \
    size_t i, found = 0;                                                   \
    for (i = 0; i < n; i++) {                                              \
        if (__builtin_popcountll(values[i] ^ probe) <= distance)           \
            near[found++] = i;                                             \
    }                                                                      \
    return found;

static inline size_t near_values_portable(const uint64_t* values, size_t n, uint64_t probe,
                                          int distance, size_t* near) {
    NEAR_VALUES_BODY
}

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("popcnt")))
static size_t near_values_popcnt(const uint64_t* values, size_t n, uint64_t probe,
                                 int distance, size_t* near) {
    NEAR_VALUES_BODY
}
#endif

/* Write to ``near`` the indices of the ``n`` ``values`` within ``distance``
   bits of ``probe``, in order; returns how many. */
static inline size_t near_values(const uint64_t* values, size_t n, uint64_t probe, int distance,
                                 size_t* near) {
#if defined(__x86_64__) && defined(__GNUC__)
    if (__builtin_cpu_supports("popcnt"))
        return near_values_popcnt(values, n, probe, distance, near);
#endif
    return near_values_portable(values, n, probe, distance, near);
}

#endif
