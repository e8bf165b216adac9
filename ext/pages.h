/* The pages a write will change, checked before LMDB changes them.
 *
 * LMDB trusts the pages it changes. A damaged bound of a page's free space, or
 * a node offset or size, makes it copy or move bytes past the buffer it
 * allocated for its copy of the page: the process's heap is corrupted and the
 * process aborts later, far from the cause, where the fault guard cannot turn
 * it into an error. A damaged page number in a branch or in the list of free
 * pages makes it free, or hand out, a page in use, which a later write
 * overwrites. So the file's own pages a write will change or trust are
 * checked first, and a page that fails is MDB_CORRUPTED before LMDB touches
 * it:
 * - before a put or delete, the path to the key in the sub-database's tree as
 *   its transaction began (and in the tree of the key's duplicates), the
 *   overflow pages of the value it replaces, and for a delete each page's
 *   neighbours, which LMDB may merge an emptied page with;
 * - before a sub-database is emptied, its branch pages and the pages they
 *   name (with duplicates or overflow pages, every page LMDB reads to free);
 * - once a transaction, before its first write, LMDB's list of free pages:
 *   every page of it, and every page number it lists;
 * - before a commit, every page of the main tree, to which LMDB writes each
 *   changed sub-database's record.
 * A page checked is one that carries its own number, is of its kind, and has
 * its bounds and every node inside it. Pages the transaction copied already
 * are LMDB's own. Left unchecked: a page two or more places from a deleted
 * key's page that LMDB merges with after earlier merges in the transaction,
 * and the first transaction of a new file.
 *
 * What is read is LMDB's on-disk format (the same since 0.9.0): a page is a
 * 16-byte header (number, pad or key size, flags, lower and upper bound of
 * the free space), 2-byte node offsets, and nodes of an 8-byte header (data
 * size, or a child's page number, in two halves; flags; key size), key, data.
 * A tree's record (in the main tree under the sub-database's name, in a meta
 * page for the main and free-page trees) is 48 bytes: pad, flags, depth, its
 * branch, leaf and overflow pages, entries, and its root. A list of free
 * pages is a count and page numbers, descending. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <lmdb.h>

#define PAGE_HEADER 16
#define NODE_HEADER 8
#define PAGE_BRANCH 0x01
#define PAGE_LEAF 0x02
#define PAGE_OVERFLOW 0x04
#define PAGE_META 0x08
#define PAGE_DIRTY 0x10
#define PAGE_LEAF2 0x20
#define NODE_BIGDATA 0x01
#define NODE_SUBDATA 0x02
#define NODE_DUPDATA 0x04
#define TREE_RECORD 48
#define TREE_READ 1      /* a memo of a tree's record (PageMap.read): read, */
#define TREE_NONE 2      /* or none in the main tree: nothing to check */
#define TREE_FLAGS 4
#define TREE_BRANCHES 8
#define TREE_LEAVES 16
#define TREE_OVERFLOWS 24
#define TREE_ROOT 40
#define TREE_DUPSORT 0x04  /* MDB_DUPSORT in a tree's flags */
#define TREE_DUPFIXED 0x10 /* MDB_DUPFIXED: duplicates of one size (its pad), on LEAF2 pages */
#define LEAF 0             /* the kinds of page a tree holds */
#define BRANCH 1
#define FIXED_LEAF 2       /* a LEAF2 page of duplicates of one size, packed after the header */
#define NO_PAGE UINT64_MAX
#define PAGE_MEMO 512
#define TREE_LEVELS 32   /* LMDB's deepest tree (its cursors' stack) */
#define META_MAGIC 16    /* in a meta page: LMDB's magic number, */
#define FREE_TREE 40     /* the free-page tree's record, */
#define MAIN_TREE 88     /* the main tree's, */
#define META_TXNID 144   /* the transaction that wrote it */
#define LMDB_MAGIC 0xBEEFC0DEu

typedef struct {
    const char *map;   /* where the data file is mapped (NULL: unknown, nothing is checked) */
    size_t map_size, page_size;
    uint64_t pages;    /* the pages the file had as the transaction began */
    MDB_dbi main;
    char **names;      /* each open sub-database's name, by handle */
    size_t n_names;
    char *records;     /* by handle, its tree's record as the transaction began, */
    uint8_t *read;     /* once read in it: TREE_READ, or TREE_NONE */
    MDB_txn *txn;      /* the write transaction the memo is of */
    size_t txnid;
    int free_sound;    /* its list of free pages was found sound */
    size_t written;    /* the last write transaction a put, delete or drop succeeded in */
    uint64_t memo[PAGE_MEMO];  /* pages found sound in it: 1 + (number << 18 | pad << 2 | kind) */
} PageMap;

static uint16_t at16(const char *p) { uint16_t x; memcpy(&x, p, 2); return x; }
static uint32_t at32(const char *p) { uint32_t x; memcpy(&x, p, 4); return x; }
static uint64_t at64(const char *p) { uint64_t x; memcpy(&x, p, 8); return x; }

static const char *page_at(const PageMap *m, uint64_t pgno) {
    return m->map + pgno * m->page_size;
}

/* A node's size in its page: header, key, and data (a page number where the
 * data is on overflow pages); a branch node has no data. */
static size_t node_size(const char *node, int branch) {
    size_t size = NODE_HEADER + at16(node + 6);
    if (branch)
        return size;
    return size + (at16(node + 4) & NODE_BIGDATA ? 8 : at16(node) | (size_t)at16(node + 2) << 16);
}

/* Whether the `size` bytes at `page` (a page, or a page of duplicates inside
 * a node) hold sound bounds and nodes, as a page of `kind` (of FIXED_LEAF:
 * of keys of `pad` bytes, 0: of the page's own pad). */
static int nodes_sound(const char *page, size_t size, int kind, size_t pad) {
    uint16_t flags = at16(page + 10), lower = at16(page + 12), upper = at16(page + 14);
    size_t n, i, at;
    if (lower < PAGE_HEADER || (lower & 1) || ((flags & PAGE_LEAF2) != 0) != (kind == FIXED_LEAF))
        return 0;
    n = (lower - PAGE_HEADER) / 2;
    if (kind == FIXED_LEAF) {  /* no offsets; the free room is what the keys leave */
        pad = pad ? pad : at16(page + 8);
        return pad && at16(page + 8) == pad && PAGE_HEADER + n * pad <= size
               && (uint16_t)(upper - lower) == (uint16_t)(size - PAGE_HEADER - n * pad);
    }
    if (lower > upper || upper > size || (kind == BRANCH && n == 0))
        return 0;
    for (i = 0; i < n; i++) {
        at = at16(page + PAGE_HEADER + 2 * i);
        if (at < upper || at > size - NODE_HEADER || node_size(page + at, kind == BRANCH) > size - at)
            return 0;
    }
    return 1;
}

/* Whether page `pgno` is a sound page of `kind` (and `pad`, as nodes_sound). */
static int page_sound(PageMap *m, uint64_t pgno, int kind, size_t pad) {
    const char *page;
    uint16_t flags;
    int branch = kind == BRANCH;
    uint64_t *memo = &m->memo[pgno % PAGE_MEMO];
    uint64_t seen = (pgno << 18 | (uint64_t)(pad & 0xffff) << 2 | (uint64_t)kind) + 1;
    if (*memo == seen)
        return 1;
    if (pgno < 2 || pgno >= m->pages)
        return 0;
    page = page_at(m, pgno);
    flags = at16(page + 10);
    if (at64(page) != pgno || (flags & (PAGE_OVERFLOW | PAGE_META))
            || !(flags & (branch ? PAGE_BRANCH : PAGE_LEAF)) || (flags & (branch ? PAGE_LEAF : PAGE_BRANCH))
            || !nodes_sound(page, m->page_size, kind, pad))
        return 0;
    *memo = seen;
    return 1;
}

/* Whether the overflow pages of a value of `size` bytes start at `pgno`, at
 * least as many as it takes (a value written again in place may take fewer). */
static int overflow_sound(const PageMap *m, uint64_t pgno, size_t size) {
    const char *page;
    uint64_t pages, count = (PAGE_HEADER - 1 + size) / m->page_size + 1;
    if (pgno < 2 || pgno >= m->pages || count > m->pages - pgno)
        return 0;
    page = page_at(m, pgno);
    pages = at16(page + 12) | (uint64_t)at16(page + 14) << 16;
    return at64(page) == pgno && (at16(page + 10) & ~PAGE_DIRTY) == PAGE_OVERFLOW
           && pages >= count && pages <= m->pages - pgno;
}

/* LMDB's default order: bytes, then length. */
static int key_order(const MDB_val *a, const char *key, size_t size) {
    int c = memcmp(a->mv_data, key, a->mv_size < size ? a->mv_size : size);
    return c ? c : (a->mv_size > size) - (a->mv_size < size);
}

static const char *node_at(const char *page, size_t i) {
    return page + at16(page + PAGE_HEADER + 2 * i);
}

/* The child LMDB goes to for `key`: the last whose first key is not above it
 * (the first child's key is not compared). */
static size_t child_for(const char *page, const MDB_val *key) {
    size_t low = 1, high = (at16(page + 12) - PAGE_HEADER) / 2, mid;
    const char *node;
    while (low < high) {  /* the first node above key, in [1, high] */
        mid = (low + high) / 2;
        node = node_at(page, mid);
        if (key_order(key, node + NODE_HEADER, at16(node + 6)) < 0)
            high = mid;
        else
            low = mid + 1;
    }
    return low - 1;
}

static uint64_t child_page(const char *node) {
    return at16(node) | (uint64_t)at16(node + 2) << 16 | (uint64_t)at16(node + 4) << 32;
}

/* The node of `key` in a leaf page, or NULL. */
static const char *leaf_node(const char *page, const MDB_val *key) {
    size_t low = 0, high = (at16(page + 12) - PAGE_HEADER) / 2, mid;
    const char *node;
    int c;
    while (low < high) {
        mid = (low + high) / 2;
        node = node_at(page, mid);
        c = key_order(key, node + NODE_HEADER, at16(node + 6));
        if (c == 0)
            return node;
        if (c < 0)
            high = mid;
        else
            low = mid + 1;
    }
    return NULL;
}

/* The kind of leaf the tree of `record` holds: LMDB's own rule, LEAF2 pages
 * for a tree of duplicates of one size. */
static int leaf_kind(const char *record) {
    return (at16(record + TREE_FLAGS) & (TREE_DUPSORT | TREE_DUPFIXED)) == TREE_DUPFIXED
           ? FIXED_LEAF : LEAF;
}

/* Whether the path to `key` in the tree of `record` is sound (and, for a
 * removal, each page's neighbours); `data`: the duplicate a put or delete of
 * a sub-database with duplicates changes, whose own tree is checked too. */
static int path_sound(PageMap *m, const char *record, const MDB_val *key, const MDB_val *data,
                      int removal) {
    uint64_t pgno = at64(record + TREE_ROOT);
    const char *page, *node;
    size_t i, n, size, levels = 0;
    uint16_t flags;
    int fixed = (at16(record + TREE_FLAGS) & TREE_DUPFIXED) != 0;
    size_t pad = at32(record);  /* md_pad, the size of a fixed duplicate */
    int leaf = leaf_kind(record);
    if (pgno == NO_PAGE)
        return 1;
    if (pgno >= m->pages)
        return 0;
    while (at16(page_at(m, pgno) + 10) & PAGE_BRANCH) {
        if (!page_sound(m, pgno, BRANCH, 0) || ++levels > TREE_LEVELS)
            return 0;
        page = page_at(m, pgno);
        n = (at16(page + 12) - PAGE_HEADER) / 2;
        i = child_for(page, key);
        pgno = child_page(node_at(page, i));
        if (pgno >= m->pages)
            return 0;
        if (removal) {  /* a page emptied below half is merged with one of these */
            flags = at16(page_at(m, pgno) + 10) & PAGE_BRANCH ? BRANCH : leaf;
            if ((i > 0 && !page_sound(m, child_page(node_at(page, i - 1)), flags, pad))
                    || (i + 1 < n && !page_sound(m, child_page(node_at(page, i + 1)), flags, pad)))
                return 0;
        }
    }
    if (!page_sound(m, pgno, leaf, pad))
        return 0;
    page = page_at(m, pgno);
    if (leaf == FIXED_LEAF || (node = leaf_node(page, key)) == NULL)
        return 1;
    flags = at16(node + 4);
    size = at16(node) | (size_t)at16(node + 2) << 16;
    if (flags & NODE_BIGDATA)
        return overflow_sound(m, at64(node + NODE_HEADER + at16(node + 6)), size);
    if (!(flags & NODE_DUPDATA) || data == NULL)
        return 1;
    node += NODE_HEADER + at16(node + 6);
    if (flags & NODE_SUBDATA)
        return size == TREE_RECORD && path_sound(m, node, data, NULL, removal);
    /* the duplicates in the node */
    return size >= PAGE_HEADER && nodes_sound(node, size, fixed ? FIXED_LEAF : LEAF, 0);
}

/* What a walk of a tree checks in its leaves. */
#define LEAVES_UNREAD 0  /* nothing: their branches name them, LMDB frees them unread */
#define LEAVES_PAGES 1   /* the pages */
#define LEAVES_FREED 2   /* and what LMDB reads to free them: overflow pages, trees of duplicates */
#define LEAVES_FREE 3    /* and the lists of the free-page tree */

static int walk_sound(PageMap *m, const char *record, uint64_t pgno, unsigned depth, int leaves,
                      size_t *budget);

/* Whether the tree of `record` is sound, its leaves as `leaves` says: every
 * leaf at its depth, and no more pages visited than it counts (LMDB counts
 * exactly or more; a damaged branch could name its own ancestor). */
static int tree_sound(PageMap *m, const char *record, int leaves) {
    size_t budget = at64(record + TREE_BRANCHES) + at64(record + TREE_LEAVES);
    uint64_t root = at64(record + TREE_ROOT);
    if (budget > m->pages)
        budget = m->pages;
    return root == NO_PAGE || (at16(record + 6) <= TREE_LEVELS
                               && walk_sound(m, record, root, at16(record + 6), leaves, &budget));
}

/* Whether a list of free pages of `size` bytes at `ids` is: its count, then
 * as many page numbers, descending, of pages the file has. */
static int free_list_sound(const PageMap *m, const char *ids, size_t size) {
    uint64_t n, i, id, last = UINT64_MAX;
    if (size < 8 || (n = at64(ids)) > size / 8 - 1)
        return 0;
    for (i = 1; i <= n; i++, last = id)
        if ((id = at64(ids + 8 * i)) >= last || id < 2 || id >= m->pages)
            return 0;
    return 1;
}

/* Whether the nodes of a sound leaf page hold what `leaves` says. */
static int leaf_nodes_sound(PageMap *m, const char *page, int leaves) {
    size_t i, n = (at16(page + 12) - PAGE_HEADER) / 2, size;
    const char *node, *data;
    uint16_t flags;
    if (leaves < LEAVES_FREED)
        return 1;
    for (i = 0; i < n; i++) {
        node = node_at(page, i);
        flags = at16(node + 4);
        size = at16(node) | (size_t)at16(node + 2) << 16;
        data = node + NODE_HEADER + at16(node + 6);
        if (flags & NODE_BIGDATA) {
            if (!overflow_sound(m, at64(data), size))
                return 0;
            data = page_at(m, at64(data)) + PAGE_HEADER;
        } else if (leaves == LEAVES_FREED && (flags & NODE_SUBDATA)) {
            if (size != TREE_RECORD || !tree_sound(m, data, LEAVES_UNREAD))
                return 0;
        }
        if (leaves == LEAVES_FREE && (at16(node + 6) != 8 || !free_list_sound(m, data, size)))
            return 0;
    }
    return 1;
}

/* walk_sound of page `pgno` of the tree of `record`, `depth` levels above
 * the leaves and them. Where LMDB frees leaves unread, it still reads the
 * first (the descent to it); the others are counted, by number. */
static int walk_sound(PageMap *m, const char *record, uint64_t pgno, unsigned depth, int leaves,
                      size_t *budget) {
    const char *page;
    size_t i, n, pad = at32(record);
    uint64_t child;
    int leaf = leaf_kind(record);
    if (depth == 0 || *budget == 0)
        return 0;
    --*budget;
    if (depth == 1)
        return page_sound(m, pgno, leaf, pad) && leaf_nodes_sound(m, page_at(m, pgno), leaves);
    if (!page_sound(m, pgno, BRANCH, 0))
        return 0;
    page = page_at(m, pgno);
    n = (at16(page + 12) - PAGE_HEADER) / 2;
    for (i = 0; i < n; i++) {
        child = child_page(node_at(page, i));
        if (depth == 2 && leaves == LEAVES_UNREAD && i > 0) {
            if (child < 2 || child >= m->pages || *budget == 0)
                return 0;
            --*budget;
        } else if (!walk_sound(m, record, child, depth - 1, leaves, budget)) {
            return 0;
        }
    }
    return 1;
}

/* The meta page LMDB takes: the one of the later transaction. */
static const char *newer_meta(const PageMap *m) {
    const char *other = m->map + m->page_size;
    return at64(m->map + META_TXNID) >= at64(other + META_TXNID) ? m->map : other;
}

/* Start the memo for write transaction `t` and check its list of free pages,
 * which LMDB reads at its first write (nothing where the memo is of `t`). */
static int page_map_begin(PageMap *m, MDB_txn *t) {
    MDB_envinfo info;
    int rc;
    if (m->txn == t && m->txnid == mdb_txn_id(t))
        return m->free_sound ? 0 : MDB_CORRUPTED;
    if ((rc = mdb_env_info(mdb_txn_env(t), &info)) != 0)
        return rc;
    memset(m->memo, 0, sizeof m->memo);
    if (m->read != NULL)
        memset(m->read, 0, m->n_names);
    m->txn = t;
    m->txnid = mdb_txn_id(t);
    m->pages = info.me_last_pgno + 1;
    if (m->pages > m->map_size / m->page_size)
        m->pages = m->map_size / m->page_size;
    m->free_sound = tree_sound(m, newer_meta(m) + FREE_TREE, LEAVES_FREE);
    return m->free_sound ? 0 : MDB_CORRUPTED;
}

/* The page map of the write transaction `t`, begun (NULL: none, or `*rc`). */
static PageMap *page_map_of(MDB_txn *t, MDB_dbi d, int *rc) {
    PageMap *m = (PageMap *)mdb_env_get_userctx(mdb_txn_env(t));
    *rc = 0;
    if (m == NULL || m->map == NULL || d >= m->n_names || m->names[d] == NULL)
        return NULL;
    return (*rc = page_map_begin(m, t)) != 0 ? NULL : m;
}

/* The record of sub-database `d`'s tree as the transaction began (NULL where
 * the main tree has none, or `*rc`). LMDB writes the records into the main
 * tree as it commits (and as a sub-database is made, which forgets the memo:
 * see page_map_name), so each is read once a transaction, not once a put. A
 * transaction after an abort can take the aborted one's id, and so its memos:
 * they hold, being the last commit's records (or the empty one of a
 * sub-database the aborted one made, which checks nothing, as none does). */
static const char *tree_record(PageMap *m, MDB_txn *t, MDB_dbi d, int *rc) {
    MDB_val name, record;
    char *memo = m->records + (size_t)d * TREE_RECORD;
    *rc = 0;
    if (m->read[d])
        return m->read[d] == TREE_READ ? memo : NULL;
    name.mv_data = m->names[d];
    name.mv_size = strlen(m->names[d]);
    *rc = mdb_get(t, m->main, &name, &record);
    if (*rc == MDB_NOTFOUND) {  /* no record: no pages to check */
        m->read[d] = TREE_NONE;
        *rc = 0;
        return NULL;
    }
    if (*rc == 0 && record.mv_size != TREE_RECORD)
        *rc = MDB_CORRUPTED;
    if (*rc != 0)
        return NULL;
    memcpy(memo, record.mv_data, TREE_RECORD);
    m->read[d] = TREE_READ;
    return memo;
}

/* Whether a put (`removal` 0) or delete of `key` (and `data`, for a
 * sub-database with duplicates) in sub-database `d` may go ahead: 0, or
 * MDB_CORRUPTED, or the error of reading where its tree is. */
static int write_sound(MDB_txn *t, MDB_dbi d, const MDB_val *key, const MDB_val *data,
                       int removal) {
    int rc;
    PageMap *m = page_map_of(t, d, &rc);
    const char *record = m ? tree_record(m, t, d, &rc) : NULL;
    if (record == NULL)
        return rc;
    return path_sound(m, record, key, data, removal) ? 0 : MDB_CORRUPTED;
}

/* Whether sub-database `d` may be emptied: LMDB frees the pages its branches
 * name, reading its leaves only where they hold duplicates or overflow pages. */
static int drop_sound(MDB_txn *t, MDB_dbi d) {
    int rc;
    PageMap *m = page_map_of(t, d, &rc);
    const char *record = m ? tree_record(m, t, d, &rc) : NULL;
    MDB_stat now;  /* LMDB goes by the tree as it is now: it may have gained overflow pages */
    if (record == NULL || (rc = mdb_stat(t, d, &now)) != 0)
        return rc;
    return tree_sound(m, record, (at16(record + TREE_FLAGS) & TREE_DUPSORT) || now.ms_overflow_pages
                      || at64(record + TREE_OVERFLOWS) ? LEAVES_FREED : LEAVES_UNREAD)
           ? 0 : MDB_CORRUPTED;
}

/* Whether sub-database `name` may be opened with MDB_CREATE in write
 * transaction `t` (which writes its record to the main tree where it is new). */
static int create_sound(MDB_txn *t, const char *name) {
    PageMap *m = (PageMap *)mdb_env_get_userctx(mdb_txn_env(t));
    MDB_val key;
    int rc;
    if (m == NULL || m->map == NULL || name == NULL)
        return 0;
    if ((rc = page_map_begin(m, t)) != 0)
        return rc;
    key.mv_data = (void *)name;
    key.mv_size = strlen(name);
    return path_sound(m, newer_meta(m) + MAIN_TREE, &key, NULL, 0) ? 0 : MDB_CORRUPTED;
}

/* Whether the commit of write transaction `t` may go ahead: LMDB writes each
 * changed sub-database's record into the main tree (a few pages, all
 * checked; its list of free pages was checked as the transaction began). */
static int commit_sound(MDB_txn *t) {
    PageMap *m = (PageMap *)mdb_env_get_userctx(mdb_txn_env(t));
    MDB_envinfo info;
    int rc;
    if (m == NULL || m->map == NULL)
        return 0;
    if ((rc = mdb_env_info(mdb_txn_env(t), &info)) != 0)
        return rc;
    if (mdb_txn_id(t) <= info.me_last_txnid)  /* a read */
        return 0;
    if ((rc = page_map_begin(m, t)) != 0)
        return rc;
    return tree_sound(m, newer_meta(m) + MAIN_TREE, LEAVES_PAGES) ? 0 : MDB_CORRUPTED;
}

/* Note the name of sub-database `d` (`name` NULL: the main one, not checked). */
static int page_map_name(MDB_env *env, MDB_dbi d, const char *name) {
    PageMap *m = (PageMap *)mdb_env_get_userctx(env);
    char **grown, *records;
    uint8_t *read;
    size_t n;
    if (m == NULL || name == NULL)
        return 0;
    if (d >= m->n_names) {
        n = d + 16;
        if ((grown = (char **)realloc(m->names, n * sizeof *grown)) == NULL)
            return ENOMEM;
        memset(grown + m->n_names, 0, (n - m->n_names) * sizeof *grown);
        m->names = grown;
        if ((records = (char *)realloc(m->records, n * TREE_RECORD)) == NULL)
            return ENOMEM;
        m->records = records;
        if ((read = (uint8_t *)realloc(m->read, n)) == NULL)
            return ENOMEM;
        memset(read + m->n_names, 0, n - m->n_names);
        m->read = read;
        m->n_names = n;
    }
    m->read[d] = 0;  /* opening may have made it: its record is read again */
    if (m->names[d] == NULL || strcmp(m->names[d], name) != 0) {
        free(m->names[d]);
        if ((m->names[d] = strdup(name)) == NULL)
            return ENOMEM;
    }
    return 0;
}

/* Forget the memo of sub-database `d`'s record, which LMDB changed. */
static void page_map_forget(MDB_env *env, MDB_dbi d) {
    PageMap *m = (PageMap *)mdb_env_get_userctx(env);
    if (m != NULL && d < m->n_names)
        m->read[d] = 0;
}

/* Find where the map of `env` lies, from the first key of its main tree (the
 * first node of a leaf): its page starts at a multiple of the smaller of the
 * OS's and LMDB's page sizes before it (the map is aligned to the OS page),
 * the one whose first node offset points at the key, and its number says how
 * far into the map that page is. Where no page is found so, nothing is
 * checked (the pages of the main tree were checked before the file was
 * mapped). */
static int page_map_find(MDB_env *env, PageMap *m) {
    MDB_txn *t;
    MDB_cursor *c;
    MDB_val k, v;
    MDB_stat stat;
    MDB_envinfo info;
    const char *key, *page;
    uint64_t pgno;
    size_t step = (size_t)sysconf(_SC_PAGESIZE), j;
    int rc;
    m->map = NULL;
    m->txn = NULL;
    if ((rc = mdb_env_stat(env, &stat)) != 0 || (rc = mdb_env_info(env, &info)) != 0)
        return rc;
    m->page_size = stat.ms_psize;
    m->map_size = info.me_mapsize;
    m->pages = info.me_last_pgno + 1;
    if (step == 0 || step > m->page_size)  /* the map is aligned to the smaller page */
        step = m->page_size;
    if (m->page_size % step)
        return 0;
    if ((rc = mdb_txn_begin(env, NULL, MDB_RDONLY, &t)) != 0)
        return rc;
    if ((rc = mdb_dbi_open(t, NULL, 0, &m->main)) == 0 && (rc = mdb_cursor_open(t, m->main, &c)) == 0) {
        if ((rc = mdb_cursor_get(c, &k, &v, MDB_FIRST)) == 0) {
            key = (const char *)k.mv_data;
            for (j = 0; j < m->page_size / step && m->map == NULL; j++) {
                page = (const char *)(((uintptr_t)key & ~(uintptr_t)(step - 1)) - j * step);
                if (page + PAGE_HEADER + 2 > key || page + at16(page + PAGE_HEADER) + NODE_HEADER != key)
                    continue;
                pgno = at64(page);
                if (pgno < 2 || pgno >= m->pages || pgno > (uintptr_t)page / m->page_size)
                    continue;
                m->map = page - pgno * m->page_size;
                if (!page_sound(m, pgno, LEAF, 0) || at32(m->map + META_MAGIC) != LMDB_MAGIC)
                    m->map = NULL;
            }
        }
        mdb_cursor_close(c);
    }
    mdb_txn_abort(t);
    return rc == MDB_NOTFOUND ? 0 : rc;
}

static void page_map_free(PageMap *m) {
    size_t i;
    for (i = 0; i < m->n_names; i++)
        free(m->names[i]);
    free(m->names);
    free(m->records);
    free(m->read);
    m->names = NULL;
    m->records = NULL;
    m->read = NULL;
    m->n_names = 0;
}
