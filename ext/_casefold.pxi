# Case folding as str.casefold, from a str straight to UTF-8. The code points
# whose folding differs are found from the running Python's own str.casefold,
# on first use (20 ms), so the folding is exactly Python's, in its Unicode
# version, expansions (ß -> ss) included. str.casefold folds each code point
# on its own, whatever its neighbours.

cdef enum:
    FOLD_BYTES = 7  # the UTF-8 of a folding, at most (6 in Unicode 15: 3 code points)

cdef uint16_t* FOLD_PAGES = NULL  # code point >> 8 -> 0, or 1 + its page in FOLD_SLOTS
cdef uint16_t* FOLD_SLOTS = NULL  # 256 a page -> 0, or 1 + the code point's folding in FOLDS
cdef uint8_t* FOLDS = NULL        # 8 bytes a folding: its length, then its UTF-8


cdef extern from "Python.h":
    object PyUnicode_New(Py_ssize_t size, uint32_t maxchar)
    void* PyUnicode_DATA(object text)
    bint PyUnicode_IS_ASCII(object text)


cdef dict casefold_changes():
    """{code point: its ``str.casefold()``} for every code point it changes,
    read in the pages of 256 whose folding differs."""
    cdef str everything = PyUnicode_New(0x110000, 0x10FFFF)  # every code point, in order
    cdef uint32_t* data = <uint32_t*>PyUnicode_DATA(everything)
    cdef uint32_t cp
    for cp in range(0x110000):
        data[cp] = cp
    changes = {}
    for page in range(0, 0x110000, 256):
        part = everything[page:page + 256]
        if part.casefold() != part:  # some code point changes (none folds to nothing)
            for cp in range(page, page + 256):
                folded = everything[cp].casefold()
                if folded != everything[cp]:
                    changes[cp] = folded
    return changes


cdef int load_casefold() except -1:
    """Fill FOLD_PAGES, FOLD_SLOTS and FOLDS from ``casefold_changes()``."""
    global FOLD_PAGES, FOLD_SLOTS, FOLDS
    changes = {cp: folded.encode("utf-8", "surrogatepass")
               for cp, folded in sorted(casefold_changes().items())}
    longest = max(changes, key=lambda cp: len(changes[cp]))
    if len(changes[longest]) > FOLD_BYTES or len(changes) >= 0xFFFF:
        raise RuntimeError("str.casefold changes %d code points, U+%04X to %d bytes: "
                           "more than the table holds" % (len(changes), longest,
                                                          len(changes[longest])))
    pages = sorted({cp >> 8 for cp in changes})
    cdef uint16_t* page_of = <uint16_t*>calloc(0x1100, sizeof(uint16_t))
    cdef uint16_t* slots = <uint16_t*>calloc(256 * len(pages) + 1, sizeof(uint16_t))
    cdef uint8_t* folds = <uint8_t*>calloc(len(changes) + 1, 8)
    cdef Py_ssize_t k, cp
    cdef bytes utf8
    if page_of == NULL or slots == NULL or folds == NULL:
        free(page_of)
        free(slots)
        free(folds)
        raise MemoryError()
    for k, cp in enumerate(pages):
        page_of[cp] = k + 1
    for k, (cp, utf8) in enumerate(changes.items(), 1):
        slots[256 * (page_of[cp >> 8] - 1) + (cp & 0xFF)] = k
        folds[8 * k] = len(utf8)
        memcpy(&folds[8 * k + 1], <const char*>utf8, len(utf8))
    FOLD_PAGES, FOLD_SLOTS, FOLDS = page_of, slots, folds
    return 0


cdef inline Py_ssize_t put_utf8(uint8_t* out, uint32_t cp) noexcept nogil:
    """Write ``cp`` as UTF-8 (a surrogate as its three bytes, as "surrogatepass");
    return its length."""
    if cp < 0x80:
        out[0] = cp
        return 1
    if cp < 0x800:
        out[0] = 0xC0 | (cp >> 6)
        out[1] = 0x80 | (cp & 0x3F)
        return 2
    if cp < 0x10000:
        out[0] = 0xE0 | (cp >> 12)
        out[1] = 0x80 | ((cp >> 6) & 0x3F)
        out[2] = 0x80 | (cp & 0x3F)
        return 3
    out[0] = 0xF0 | (cp >> 18)
    out[1] = 0x80 | ((cp >> 12) & 0x3F)
    out[2] = 0x80 | ((cp >> 6) & 0x3F)
    out[3] = 0x80 | (cp & 0x3F)
    return 4


cdef Py_ssize_t casefold_utf8(str text, uint8_t** out) except -1:
    """Write ``text.casefold().encode("utf-8", "surrogatepass")`` to a new
    malloc'd ``*out`` (the caller frees it); return its length."""
    cdef Py_ssize_t used = 0, capacity = len(text) + len(text) // 4 + 2 * FOLD_BYTES
    cdef Py_UCS4 char
    cdef uint32_t cp
    cdef uint16_t slot
    cdef uint8_t* buffer
    cdef const uint8_t* ascii
    cdef Py_ssize_t i
    if FOLDS == NULL:
        load_casefold()
    buffer = <uint8_t*>malloc(capacity)
    if buffer == NULL:
        raise MemoryError()
    out[0] = buffer
    if PyUnicode_IS_ASCII(text):  # its data is its UTF-8
        ascii = <const uint8_t*>PyUnicode_DATA(text)
        for i in range(len(text)):
            buffer[i] = ascii[i] + 32 if 65 <= ascii[i] <= 90 else ascii[i]
        return len(text)
    for char in text:
        cp = char
        if used + FOLD_BYTES > capacity:
            capacity *= 2
            grow(<void**>out, capacity)
            buffer = out[0]
        if cp < 0x80:
            buffer[used] = cp + 32 if 65 <= cp <= 90 else cp
            used += 1
            continue
        slot = FOLD_PAGES[cp >> 8]
        if slot:
            slot = FOLD_SLOTS[256 * (slot - 1) + (cp & 0xFF)]
        if slot:
            memcpy(&buffer[used], &FOLDS[8 * slot + 1], FOLDS[8 * slot])
            used += FOLDS[8 * slot]
        else:
            used += put_utf8(&buffer[used], cp)
    return used
