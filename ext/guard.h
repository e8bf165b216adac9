/* Turning faults inside LMDB calls into errors.
 *
 * LMDB reads its file through a memory map: a damaged or truncated file can
 * make it read past the end of the file (SIGBUS), follow a wild page number
 * (SIGSEGV) or fail one of its assertions (abort). Each LMDB call runs with a
 * jump target set for this thread (the g_* wrappers below); the handlers jump
 * back to it, so the caller gets GUARD_FAULT instead of a dead process. Faults outside
 * a guarded call go to the handler that was there before. After a fault the
 * environment is in an unknown state: the caller must never use it again.
 * Damage that would make LMDB write outside its buffers instead of faulting
 * is found before each put and delete (pages.h). */
#include <setjmp.h>
#include <signal.h>
#include <string.h>
#include <lmdb.h>
#include "pages.h"

#define GUARD_FAULT (-30000)

/* volatile: a store before an inlined call the compiler can see into (memcpy
 * in g_copy) would otherwise be dropped as dead, leaving that call unguarded */
static __thread sigjmp_buf *volatile guard_target = NULL;
static __thread int guard_signal = 0;
static struct sigaction guard_previous_segv, guard_previous_bus;

static void guard_jump(int sig) {
    sigjmp_buf *target = guard_target;
    guard_target = NULL;
    guard_signal = sig;
    siglongjmp(*target, 1);
}

static void guard_handler(int sig, siginfo_t *info, void *context) {
    struct sigaction *previous;
    if (guard_target != NULL)
        guard_jump(sig);
    previous = sig == SIGBUS ? &guard_previous_bus : &guard_previous_segv;
    if (previous->sa_flags & SA_SIGINFO)
        previous->sa_sigaction(sig, info, context);
    else if (previous->sa_handler != SIG_IGN && previous->sa_handler != SIG_DFL)
        previous->sa_handler(sig);
    /* the default action from here: the faulting instruction runs again and
     * ends the process, as it would have without us */
    signal(sig, SIG_DFL);
}

static void guard_assert(MDB_env *env, const char *msg) {
    (void)env;
    (void)msg;
    if (guard_target != NULL)
        guard_jump(SIGABRT);
}

/* Put the handlers in front (again: faulthandler, for one, may have been
 * enabled since), keeping whatever was there for faults outside a guard. */
static int guard_install(void) {
    struct sigaction action, current;
    if (sigaction(SIGSEGV, NULL, &current) == 0 && current.sa_sigaction == guard_handler)
        return 0;
    memset(&action, 0, sizeof action);
    action.sa_sigaction = guard_handler;
    action.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK;
    sigemptyset(&action.sa_mask);
    if (sigaction(SIGSEGV, &action, &guard_previous_segv) != 0)
        return -1;
    if (sigaction(SIGBUS, &action, &guard_previous_bus) != 0)
        return -1;
    return 0;
}

static int guard_last_signal(void) {
    return guard_signal;
}

/* Each LMDB call the native backend makes goes through one of these: a
 * fault inside it returns GUARD_FAULT to the caller, which unwinds normally. */
#define GUARDED(call) do { \
        sigjmp_buf target_; \
        sigjmp_buf *outer_ = guard_target; \
        if (sigsetjmp(target_, 0) != 0) { guard_target = outer_; return GUARD_FAULT; } \
        guard_target = &target_; \
        rc_ = (call); \
        guard_target = outer_; \
    } while (0)

static int g_page_map_find(MDB_env *e, PageMap *m) {
    int rc_; GUARDED(page_map_find(e, m)); return rc_; }

/* Note that write transaction `t` changed the file (rc 0): its commit writes
 * (LMDB commits a transaction that changed nothing without writing, and the
 * next one takes its id). */
static int note_written(MDB_txn *t, int rc) {
    PageMap *m = (PageMap *)mdb_env_get_userctx(mdb_txn_env(t));
    if (rc == 0 && m != NULL)
        m->written = mdb_txn_id(t);
    return rc;
}

/* Whether write transaction `t` changed the file (note_written). */
static int g_txn_written(MDB_txn *t) {
    PageMap *m = (PageMap *)mdb_env_get_userctx(mdb_txn_env(t));
    return m != NULL && m->written == mdb_txn_id(t);
}

static int g_get(MDB_txn *t, MDB_dbi d, MDB_val *k, MDB_val *v) {
    int rc_; GUARDED(mdb_get(t, d, k, v)); return rc_; }
static int g_put(MDB_txn *t, MDB_dbi d, MDB_val *k, MDB_val *v, unsigned int f) {
    int rc_; GUARDED(write_sound(t, d, k, v, 0)); if (rc_) return rc_;
    GUARDED(mdb_put(t, d, k, v, f)); return note_written(t, rc_); }
static int g_del(MDB_txn *t, MDB_dbi d, MDB_val *k, MDB_val *v) {
    int rc_; GUARDED(write_sound(t, d, k, v, 1)); if (rc_) return rc_;
    GUARDED(mdb_del(t, d, k, v)); return note_written(t, rc_); }
static int g_cursor_get(MDB_cursor *c, MDB_val *k, MDB_val *v, MDB_cursor_op op) {
    int rc_; GUARDED(mdb_cursor_get(c, k, v, op)); return rc_; }
static int g_cursor_put(MDB_cursor *c, MDB_val *k, MDB_val *v, unsigned int f) {
    int rc_; GUARDED(write_sound(mdb_cursor_txn(c), mdb_cursor_dbi(c), k, v, 0)); if (rc_) return rc_;
    GUARDED(mdb_cursor_put(c, k, v, f)); return note_written(mdb_cursor_txn(c), rc_); }
static int g_stat(MDB_txn *t, MDB_dbi d, MDB_stat *s) {
    int rc_; GUARDED(mdb_stat(t, d, s)); return rc_; }
static int g_drop(MDB_txn *t, MDB_dbi d, int del) {  /* del: LMDB deletes its record now */
    int rc_; GUARDED(drop_sound(t, d)); if (rc_) return rc_;
    GUARDED(mdb_drop(t, d, del));
    if (rc_ == 0 && del)
        page_map_forget(mdb_txn_env(t), d);
    return note_written(t, rc_); }
static int g_txn_commit(MDB_txn *t) {  /* the transaction is ended, as by LMDB's */
    int rc_; GUARDED(commit_sound(t)); if (rc_) { mdb_txn_abort(t); return rc_; }
    GUARDED(mdb_txn_commit(t)); return rc_; }
static int g_dbi_open(MDB_txn *t, const char *name, unsigned int f, MDB_dbi *d) {
    int rc_;
    if (f & MDB_CREATE) {
        GUARDED(create_sound(t, name)); if (rc_) return rc_;
    }
    GUARDED(mdb_dbi_open(t, name, f, d));
    return rc_ ? rc_ : page_map_name(mdb_txn_env(t), *d, name); }
static int g_cursor_open(MDB_txn *t, MDB_dbi d, MDB_cursor **c) {
    int rc_; GUARDED(mdb_cursor_open(t, d, c)); return rc_; }
static int g_txn_begin(MDB_env *e, MDB_txn *parent, unsigned int f, MDB_txn **t) {
    int rc_; GUARDED(mdb_txn_begin(e, parent, f, t)); return rc_; }
static int g_copy(void *dst, const void *src, size_t n) {
    int rc_; GUARDED((memcpy(dst, src, n), 0)); return rc_; }
