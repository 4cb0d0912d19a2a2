/* refit.pml — Promela model of the bitrefit refit protocol (shared/DESIGN.md, "The protocol").
 *
 * This is an independent model of the rules, written for spin; the C++ checker in proofs/ drives the
 * real state machines instead. Both check the same invariants; spin additionally proves liveness
 * (an LTL formula under weak fairness), which the C++ checker approximates by reverse reachability.
 *
 * Abstraction
 *  - NR receivers, NO owners with NS payloads each; payload (o, s) writes region p = o*NS + s, so the
 *    positions of one attempt are disjoint. A region holds a version number, LOST after a crash, or
 *    GARBAGE (an XOR applied on any base other than its own; the invariant asserts it never happens).
 *  - The network is a bag of copies: bag[a][r][p] counts in-flight copies of payload p of attempt a
 *    to receiver r, so delivery order is arbitrary. An ack is delivered or lost as it is sent (a
 *    late ack of another attempt is ignored on arrival, so its delay is not modelled).
 *  - Owners freeze their change set and put their payload copies on the network as the prepare
 *    is persisted (one step); the bag still delivers them in every order.
 *  - Deadlines are nondeterministic coordinator steps; no clock is in the state.
 *  - A prepare and the mark_obsolete that may follow it race to each receiver: a receiver may admit
 *    an attempt the coordinator has already given up (and stop on the obsolete), or hear of the
 *    obsolete first and ignore the prepare (heard[r]); stop_and_wait waits for both cases. A receiver
 *    not waited for may even admit a late prepare of an older attempt of the transition after a
 *    newer one was prepared (ADMIT_OLDER).
 *  - A crash is the receiver's restart as a newer incarnation (restored at its next admission); the
 *    coordinator's roster (rinc) learns the newer incarnation only when its join arrives, a step of
 *    its own, so a prepare in between names the dead incarnation.
 *  - Membership: an attempt names the receivers the roster holds as members (rok: known, not
 *    evicted, at K). A member that has not stopped when stop_and_wait's deadline passes is evicted
 *    (EVICTS budget); a receiver left out of a commit is behind. Either restores K densely under a
 *    new incarnation (FALL_BEHIND) and joins again. A new coordinator's roster holds the members of
 *    the last persisted attempt; any other receiver is unknown until its join answers the roll
 *    call, so an attempt may name fewer receivers, or none. A receiver still in an attempt answers
 *    the roll call by restoring K densely under a new incarnation first (ANSWER_ROLL_CALL, H2).
 *  - Sender restarts (SRESTARTS, default 0): the coordinator and every owner restart (a failover,
 *    and the owners' durable frozen images kept or lost), and the trainer has moved on: its bits of
 *    the next version differ from those the transition's prepares name (tflav, named). A retry
 *    sends from the durable image; an owner without the named one answers frozen_lost and the
 *    coordinator aborts (flost). Regions still hold version numbers only: the bits an owner
 *    freezes are checked where it freezes them (as the C++ monitor does, finding B1).
 *  - Owner crashes (OCRASHES, default 0): an owner restarts from its durable baseline, frozen image
 *    and sender epoch; what it loses is highest_seen, so from then on a late or duplicated copy of
 *    any persisted prepare may reach it and look new (late_prepare; the model's owners otherwise
 *    take each prepare once, as it is persisted). owner.hpp ignores such a copy when its sender
 *    process is gone (finding H1) or its target is not above the baseline (finding B3); one that
 *    passes both is its own transition's, whose image the owner holds, so it changes nothing the
 *    model tracks. The two mutations below drop those guards.
 *  - Claim faults (CFAULTS, default 0): a coordinator's claim of its epoch (the first one's, or a
 *    failover's) takes effect in the log and its reply is lost. The coordinator reads the log's
 *    epoch back and finds its own: the claim took effect, and it goes on as after a plain claim
 *    (coordinator.hpp, finding B4), so the fault changes nothing else the model tracks.
 *  - Faults are budgeted: CRASHES receiver crashes, FAILOVERS coordinator failovers, DROPS lost copies,
 *    DUPS duplicated copies, EVICTS evictions. A fault that forces a retry is only enabled while the transition has
 *    attempts left (natt < MAXA): the "eventually reliable delivery and stable members" assumption
 *    under which liveness is claimed (operator abort is excluded).
 *
 * Limits: the option lists below (INGEST, APPLY, DROP, DUP) are written out for NP <= 4 regions per
 * receiver and NATT <= 6 attempts; the per-receiver rules (SEQ_R, OPT_R, ALL_R, ...) for NR = 1..5,
 * the per-owner ones (SEQ_O, ALL_O) for NO = 1..4.
 *
 * Trace mode (-DTRACE, proofs/spin_trace.cpp): the model follows one run of the C++ machines. A
 * generated `trace.pml` defines TLEN and `trace_init()`, which fills ev_k/ev_x/ev_y with the run's
 * events in order; every step that has a C++ counterpart (see the table in
 * bitrefit_proofs/spin_trace.hpp) is enabled only when it is the next event (EV) and consumes it
 * (NEXT); the steps without one (owners' baseline reads, the commit request, stop completion,
 * recovery) stay free. Faults are then taken when the run took them (CAN_FAIL and the phase guards
 * on crash/failover are lifted: the run, not the model, decides). -DTRACE_REACH turns every
 * assertion off and asserts instead that the trace is not complete: an "error" then proves the run
 * is realizable in the model. -DTRACE_FREE_TAIL lets the model run free once the trace is consumed
 * (for runs that end in a C++ violation, whose monitor may fire before the model's assertion).
 * -DTRACE_GOAL (liveness per run, for runs that end without a violation) turns the assertions off,
 * lets the model run free after the trace with no fault but a deadline, and asserts that the
 * liveness formula's proposition (every transition ended, the roster converged) does not hold
 * there: an "error" proves the run is realizable and that the model can still end it.
 *
 * Mutations (compile with -DMUT_x; each must make spin report an assertion violation):
 *   MUT_XOR_RETRY          retry attempts use XOR instead of overwrite
 *   MUT_COMMIT_EARLY       the coordinator asks for commit after the first ack, not all of them
 *   MUT_DEDUP_OFF          a receiver applies a verified duplicate again
 *   MUT_DELTA_UNCOMMITTED  an owner moves its baseline to v+1 at freeze and encodes XOR against it
 *   MUT_NO_STOP            retry prepares without stop_and_wait
 *   MUT_BLIND_WRITE        the commit log writes K without compare-and-set or fencing
 *   MUT_EVICTED_REJOINS    an evicted receiver joins again without restoring (keeps its bits)
 *   MUT_ABORT_KEEPS_MEMBERS an abort leaves its members in the roster (no dense restore)
 *   MUT_JOIN_MID_ATTEMPT   a receiver in an attempt answers a roll call with its old incarnation
 *   MUT_KEEP_DEAD_INCARNATION the roster ignores the join of a newer incarnation of a receiver it
 *                          knows: that receiver is never a member again (caught by the liveness
 *                          formula, not by an assertion: the twin of the C++ keep_dead_incarnation)
 *   MUT_OLD_INCARNATION_ACKS the coordinator matches acks and joins by receiver only: a member's
 *                          newer incarnation joining during transfer leaves the attempt live with
 *                          the dead one's ack, and the commit counts the newer one as at K (the
 *                          twin of the C++ mutation accept_old_incarnation_acks)
 *   MUT_REFREEZE_AT_RESTART an owner without the frozen image a retry names freezes the trainer's
 *                          current bits for it instead of answering frozen_lost (needs SRESTARTS;
 *                          the twin of the C++ refreeze_at_restart, finding B1)
 *   MUT_FREEZE_STALE_PREPARE an owner freezes a late prepare whose target is not above its baseline
 *                          (needs OCRASHES; the twin of the C++ freeze_stale_prepare, finding B3)
 *   MUT_OWNER_FORGETS_SENDER_EPOCH an owner forgets at its crash which sender process it belongs
 *                          to, so a late prepare of a dead sender freezes the trainer's current bits
 *                          (needs OCRASHES and SRESTARTS; the twin of the C++
 *                          owner_forgets_sender_epoch, finding H1)
 *   MUT_UNFENCED_ABORT     the coordinator tells an abort's members without persisting the abort
 *                          (needs ABORTS; the twin of the C++ unfenced_abort, finding B6)
 *   MUT_JOIN_CONFIRMED_BY_ANY_ANNOUNCE a receiver whose join was lost takes an announce that does not
 *                          name it for its join's confirmation and never joins again as that
 *                          incarnation: the roster keeps the dead one (caught by the liveness
 *                          formula; needs CRASHES and DROPS; the twin of the C++
 *                          join_confirmed_by_any_announce, finding B2)
 *   MUT_RECLAIM_UNKNOWN_EPOCH after a claim whose reply was lost the coordinator claims the same
 *                          epoch again, which the log fences: it deposes itself, and with no
 *                          failover left nothing ever ends (caught by the liveness formula; needs
 *                          CFAULTS; the twin of the C++ reclaim_unknown_epoch, finding B4)
 * and, for the trace check's drift tests only (no exhaustive run reaches what they change: the
 * exhaustive runs have NOVW = 0 and restore a receiver not waited for at once):
 *   MUT_OVW_AS_XOR         an overwrite payload riding in an XOR attempt is applied as XOR
 *   MUT_ADMIT_CURRENT_ONLY a receiver admits only the newest attempt, never a late older prepare
 *   MUT_RESTART_LOSES_IMAGES every owner's frozen image is gone after a sender restart (trace mode)
 */

#ifndef NR
#define NR 2
#endif
#ifndef NO
#define NO 2
#endif
#ifndef NS
#define NS 2
#endif
#ifndef NTRANS
#define NTRANS 2
#endif
#ifndef MAXA
#define MAXA 2
#endif
#ifndef CRASHES
#define CRASHES 1
#endif
#ifndef FAILOVERS
#define FAILOVERS 1
#endif
#ifndef DROPS
#define DROPS 1
#endif
#ifndef DUPS
#define DUPS 1
#endif
#ifndef ABORTS
#define ABORTS 0 /* operator aborts (or an owner's frozen_lost): a transition ends without commit */
#endif
#ifndef EVICTS
#define EVICTS 1
#endif
#ifndef SRESTARTS
#define SRESTARTS 0 /* sender restarts (see the header): none unless asked for */
#endif
#ifndef OCRASHES
#define OCRASHES 0 /* owner crashes (see the header): none unless asked for */
#endif
#ifndef CFAULTS
#define CFAULTS 0 /* claims whose reply is lost after the log applied them (see the header) */
#endif
#ifndef NOVW
#define NOVW 0 /* the last NOVW payloads of every owner are coded as overwrite even in an XOR attempt */
#endif

#ifdef MUT_NO_STOP
#define DEVICE_QUEUE /* the race stop_and_wait prevents needs writes in flight on the device */
#endif

#define NP (NO * NS)
#define ALLP ((1 << NP) - 1)

/* One receiver's rule written once and spelled out for every receiver (Promela has no loops over
 * guards): SEQ_R(M) is M(0); M(1); ... as statements, OPT_R(M) the options M(0) M(1) ... of a do or
 * if, ALL_R(P) and ANY_R(P) the conjunction and disjunction of P(0), P(1), ..., BITS_R(P) the
 * bitmask of the receivers r with P(r) (P(r) is 0 or 1). */
#if NR == 1
#define SEQ_R(M) M(0)
#define OPT_R(M) M(0)
#define ALL_R(P) (P(0))
#define ANY_R(P) (P(0))
#define BITS_R(P) (P(0))
#elif NR == 2
#define SEQ_R(M) M(0); M(1)
#define OPT_R(M) M(0) M(1)
#define ALL_R(P) (P(0) && P(1))
#define ANY_R(P) (P(0) || P(1))
#define BITS_R(P) (P(0) | P(1) << 1)
#elif NR == 3
#define SEQ_R(M) M(0); M(1); M(2)
#define OPT_R(M) M(0) M(1) M(2)
#define ALL_R(P) (P(0) && P(1) && P(2))
#define ANY_R(P) (P(0) || P(1) || P(2))
#define BITS_R(P) (P(0) | P(1) << 1 | P(2) << 2)
#elif NR == 4
#define SEQ_R(M) M(0); M(1); M(2); M(3)
#define OPT_R(M) M(0) M(1) M(2) M(3)
#define ALL_R(P) (P(0) && P(1) && P(2) && P(3))
#define ANY_R(P) (P(0) || P(1) || P(2) || P(3))
#define BITS_R(P) (P(0) | P(1) << 1 | P(2) << 2 | P(3) << 3)
#elif NR == 5
#define SEQ_R(M) M(0); M(1); M(2); M(3); M(4)
#define OPT_R(M) M(0) M(1) M(2) M(3) M(4)
#define ALL_R(P) (P(0) && P(1) && P(2) && P(3) && P(4))
#define ANY_R(P) (P(0) || P(1) || P(2) || P(3) || P(4))
#define BITS_R(P) (P(0) | P(1) << 1 | P(2) << 2 | P(3) << 3 | P(4) << 4)
#else
#error "refit.pml spells its per-receiver rules out for NR = 1..5"
#endif
/* the same for owners: SEQ_O(M), ALL_O(P) */
#if NO == 1
#define SEQ_O(M) M(0)
#define ALL_O(P) (P(0))
#elif NO == 2
#define SEQ_O(M) M(0); M(1)
#define ALL_O(P) (P(0) && P(1))
#elif NO == 3
#define SEQ_O(M) M(0); M(1); M(2)
#define ALL_O(P) (P(0) && P(1) && P(2))
#elif NO == 4
#define SEQ_O(M) M(0); M(1); M(2); M(3)
#define ALL_O(P) (P(0) && P(1) && P(2) && P(3))
#else
#error "refit.pml spells its per-owner rules out for NO = 1..4"
#endif
#if NP > 4
#error "refit.pml's option lists (INGEST, APPLY, DROP, DUP) hold at most 4 regions per receiver (NO * NS)"
#endif
#ifdef TRACE
#define NATT 6 /* attempt ids 1..NATT; 0 = none (the translation keeps a run within 6 attempts) */
#else
#if SRESTARTS > 0
#define NATT ((NTRANS + ABORTS + SRESTARTS) * MAXA) /* an abort (an owner's frozen_lost too) starts it afresh */
#else
#define NATT ((NTRANS + ABORTS) * MAXA) /* an abort starts the transition afresh */
#endif
#endif
#if NATT > 6
#error "refit.pml's option lists (INGEST, APPLY) hold at most 6 attempts"
#endif
#define GARBAGE 15
#define LOST 14
#define XOR 0
#define OVW 1
#define NOMEM 255 /* a_inc of a receiver the attempt does not name */

/* coordinator phases */
#define IDLE 0
#define TRANSFER 1
#define COMMITTING 2
#define STOPPING 3
#define RECOVERING 4
#define ABORTING 5 /* stop_and_wait, then the abort is persisted and the transition is over */
#define DEPOSED 6  /* fenced by the log: takes no step (only MUT_RECLAIM_UNKNOWN_EPOCH gets here) */
/* commit-log replies */
#define R_NONE 0
#define R_SUCCESS 1
#define R_FAILED 2
#define R_LOST 3

/* ---- commit log (durable) ---------------------------------------------------------------- */
byte Kv = 0;         /* K = (v, g); g is identified with the attempt that committed it */
byte Katt = 0;
byte log_epoch = 0;  /* only this epoch's coordinator may prepare or commit */
byte log_closed = 0; /* read_commit(a) closes a: a later compare-and-set of a <= log_closed fails */
/* the persisted attempt records (prepare) */
byte cur = 0;
bit a_mode[NATT + 1];
byte a_target[NATT + 1];
bit a_obsolete[NATT + 1];
byte a_mem[NATT + 1];  /* the receivers the attempt names (bitmask) */
bit cur_aborted = 0;   /* the abort of attempt cur is persisted: its transition is over */
byte a_base[(NATT + 1) * NO];
/* the compare-and-set request in flight and its reply */
bit req = 0;
byte req_att, req_epoch, req_target;
byte rep = R_NONE;

/* ---- coordinator (volatile, lost at failover) --------------------------------------------- */
byte epoch = 0;
byte phase = IDLE;
byte rinc[NR];   /* roster: the incarnation of each receiver it knows (from the last join) */
bit rok[NR] = 1; /* ... and that incarnation can be named: known, not evicted, at K (both joined) */
#ifdef MUT_KEEP_DEAD_INCARNATION
bit rknown[NR] = 1; /* the roster has an entry for r (evicted or lagging ones too): only this
                     * mutation reads it, and rinc with it */
#endif
byte acks = 0;   /* members whose ack of cur was accepted */
byte natt = 0;   /* attempts of the current transition */
byte ntrans = 0; /* completed transitions */

/* ---- owners ------------------------------------------------------------------------------ */
byte B[NO]; /* baseline version B^v */
#if SRESTARTS > 0
byte F[NO];        /* owner o's durable frozen image of the transition: 0 none, else 1 + the trainer
                    * bits it holds (a restart may lose it) */
byte tflav = 0;    /* the trainer's bits of the next version: each sender restart finds them moved on */
byte named = 0;    /* the trainer bits the transition's prepares name (tflav at its first prepare) */
bit flost = 0;     /* an owner answered the current attempt with frozen_lost */
byte srestarts = 0;
#endif
#if OCRASHES > 0
byte ocrashes = 0;
bit ocrashed[NO];  /* owner o lost its highest_seen in a crash (a sender restart gives it back: the
                    * restarted owner has seen every persisted prepare) */
#if SRESTARTS > 0
byte oepoch[NO];          /* the epoch of the sender process owner o belongs to (durable) */
byte a_epoch[NATT + 1];   /* the coordinator epoch that persisted attempt a */
byte a_named[NATT + 1];   /* the trainer bits attempt a's prepare names (named then) */
#endif
#endif

/* ---- receivers --------------------------------------------------------------------------- */
byte reg[NR * NP];
byte inc[NR];
byte act[NR];                  /* attempt the receiver is in (0 = none) */
#ifdef TRACE
byte btw[NR];                  /* the attempt it stopped since its last admission or restart: it is
                                * "between" attempts (receiver.hpp in_attempt) until the next
                                * admission, a restore, or the news that that attempt committed */
#define SET_BETWEEN(r) btw[r] = act[r]
#define CLEAR_BETWEEN(r) btw[r] = 0
#else
/* the exhaustive runs take a roll call only where the roster forgot a receiver, which is then in
 * no attempt (asserted: JOIN_ANSWERS), so they need not track it */
#define SET_BETWEEN(r) skip
#define CLEAR_BETWEEN(r) skip
#endif
byte heard[NR];                /* the newest attempt whose prepare or mark_obsolete it has seen: an
                                * older or equal prepare is ignored (receiver.hpp) */
byte seen[NR];                 /* dedup: verified payload ids of act */
bit acked[NR];
bit stale[NR];                 /* restarted: must dense-restore to K.v before joining */
bit behind[NR];                /* this incarnation was evicted, or left out of a commit: it restores K
                                * densely under a new incarnation before it joins again */
byte pend[(NATT + 1) * NR];    /* decoded writes queued on the device, per attempt: bitmask of p */
byte a_inc[(NATT + 1) * NR];   /* incarnation bound at prepare */
byte ghost_acked[NATT + 1];    /* which members really acked (ghost, for the commit check) */

/* ---- network ----------------------------------------------------------------------------- */
byte bag[(NATT + 1) * NR * NP];

/* ---- fault budgets ----------------------------------------------------------------------- */
byte crashes = 0, failovers = 0, drops = 0, dups = 0, evicts = 0, aborts = 0;

#define BAG(a, r, p) bag[((a) * NR + (r)) * NP + (p)]
#define PEND(a, r) pend[(a) * NR + (r)]

#ifdef MUT_JOIN_CONFIRMED_BY_ANY_ANNOUNCE
bit jgone[NR]; /* this incarnation gave its join up (see JOINS) */
#define JOIN_AFRESH(r) ; jgone[r] = 0
#else
#define JOIN_AFRESH(r)
#endif
/* Receiver r starts again as a newer incarnation with nothing (a crash, or a dense restore): it
 * restores K.v at its next admission (stale). What it had heard is cleared: no attempt up to cur
 * names the new incarnation, and every later one is newer than anything it heard. */
#define RESTART(r) \
  CLEAR_BETWEEN(r); inc[r]++; act[r] = 0; heard[r] = 0; seen[r] = 0; acked[r] = 0; stale[r] = 1; behind[r] = 0; \
  i = 0; \
  do :: i <= NATT -> PEND(i, r) = 0; i++ :: else -> break od; \
  i = 0; \
  do :: i < NP -> reg[(r) * NP + i] = LOST; i++ :: else -> break od; \
  i = 0 JOIN_AFRESH(r)

/* Receiver r's incarnation was evicted, or left out of a commit: it restores K densely under a new
 * incarnation before it joins again. In C++ it does so once told (an announcement), and may still
 * work on its old attempt until then; so does the trace mode (behind, a receiver step). Those
 * steps touch only r's own state, which the restore clears, and nothing anyone else reads: the
 * exhaustive runs restore at once (the same states for everyone else, far fewer interleavings). */
#ifdef MUT_EVICTED_REJOINS
#define FALL_BEHIND(r) skip
#elif defined(TRACE)
#define FALL_BEHIND(r) behind[r] = 1
#else
#define FALL_BEHIND(r) RESTART(r)
#endif

/* ---- trace mode (see the header comment) ------------------------------------------------- */
#define E_PREP 1     /* the coordinator's prepare is persisted              (no args)            */
#define E_ADMIT 2    /* receiver x admits attempt y                                               */
#define E_INGEST 3   /* receiver x ingests payload copy: y = attempt * 8 + region                 */
#define E_ACK 4      /* receiver x acks: y = 0 delivered, 1 lost                                   */
#define E_DEADLINE 5 /* the coordinator's deadline during transfer                                 */
#define E_CAS 6      /* the log answers the compare-and-set: y = 1 ok, 2 written/lost, 3 failed, 4 lost */
#define E_CRASH 7    /* receiver x crashes (and restarts: it must restore before admission)        */
#define E_FAILOVER 8 /* a new coordinator takes over                                               */
#define E_DROP 9     /* a copy of payload region y of the current attempt to receiver x is lost    */
#define E_DUP 10     /* ... is duplicated                                                          */
#define E_REJOIN 11  /* a newer incarnation of a member joins: the attempt is obsolete (under
                      * MUT_OLD_INCARNATION_ACKS it stays live)                                   */
#define E_EVICT 12   /* stop_and_wait's deadline: members not stopped are evicted, the stop ends    */
#define E_ABORT 13   /* the coordinator aborts the transition (operator, or an owner's frozen_lost) */
#define E_ROLL_CALL 14 /* a new coordinator's roll call reaches receiver x                        */
#define E_SRESTART 15  /* the sender restarts: y = the owners whose durable image still holds the
                        * bits the transition's prepares name (the failover is E_FAILOVER, later) */
#define E_OCRASH 16    /* owner x crashes (its highest_seen is gone)                               */
#define E_LATE_PREP 17 /* owner x takes a copy of attempt y's prepare that was persisted before its
                        * crash and looks new to it (late_prepare)                                 */
#define E_STALE_JOIN 18 /* the roster takes a join that receiver x's incarnation y back sent (a dead
                         * one: STALE_JOIN_STEP)                                                    */
#define E_CLAIM_UNKNOWN 19 /* the claim just made took effect, and its reply was lost (CLAIM_FAULT) */
#define E_JOIN_LOST 20 /* receiver x's join is lost while it waits for the confirmation (JOIN_LOST)  */
#ifdef TRACE_GOAL
#define TRACE_REACH
#define TRACE_FREE_TAIL
#endif
#ifdef TRACE
#include "trace.pml"
byte ev_k[TLEN];
byte ev_x[TLEN];
byte ev_y[TLEN];
byte tp = 0;
#ifdef TRACE_FREE_TAIL
/* after the last event the model runs free (within its budgets and the fault bound): the C++
 * monitors fire at other points than the model's assertions (e.g. version alignment at prepare
 * persistence vs at each member's admission), so a C++ violation must make the model violate along
 * the trace or in some continuation of it */
#define TAIL (tp >= TLEN)
#ifdef TRACE_GOAL
/* liveness "once faults stop": no fault after the run (the abort budget is the run's own, so none
 * is left either), but a deadline, which is no fault: the C++ fair scheduler that judges the
 * run's end fires deadlines too */
#define CAN_FAIL (tp < TLEN)
#define CAN_TIME_OUT (tp < TLEN || natt < MAXA)
/* ...and stop_and_wait's deadline, which evicts whoever has not stopped: C++'s fair scheduler
 * fires it too, so the tail is not bound by the run's count of evictions */
#define EVICT_OK (evicts < EVICTS || tp >= TLEN)
#else
#define CAN_FAIL (tp < TLEN || natt < MAXA)
/* No roll call is answered in the tail: the run's own are its events. Unbounded, the answers
 * (each restarts a receiver in an attempt, whose newer incarnation's join makes the attempt
 * obsolete) let the tail retry past the NATT attempts the arrays hold, and pan's depth-first
 * search stopped there ("invalid array index") before any assertion of the protocol; bounded like
 * a fault (natt < MAXA) they made it search 14.6 million states (257 s) for one counterexample's
 * violation, 0.37 million (6 s) without them. Fewer continuations can only hide a violation (a
 * disagreement), never make one up. */
#define ROLL_CALL_OK (tp < TLEN)
#endif
#else
#define TAIL false
#define CAN_FAIL 1
#endif
#ifndef ROLL_CALL_OK
#define ROLL_CALL_OK 1
#endif
#define EV(k, x, y) (TAIL || (tp < TLEN && ev_k[tp] == (k) && ev_x[tp] == (x) && ev_y[tp] == (y)))
#define EVK(k, x) (TAIL || (tp < TLEN && ev_k[tp] == (k) && ev_x[tp] == (x)))
#define EVY(v) (TAIL || ev_y[tp] == (v))
#define NEXT if :: tp < TLEN -> tp++ :: else -> skip fi
#define FAULT_PHASE_OK (tp < TLEN || phase != IDLE)
#ifdef TRACE_REACH
#define CHECK(e) skip
#endif
#else
#define EV(k, x, y) true
#define EVK(k, x) true
#define EVY(v) true
#define NEXT skip
#define CAN_FAIL (natt < MAXA) /* a fault that forces a retry needs an attempt left */
#define FAULT_PHASE_OK (phase != IDLE)
#endif
#ifndef CAN_TIME_OUT
#define CAN_TIME_OUT CAN_FAIL /* the deadline during transfer: a fault everywhere but TRACE_GOAL's tail */
#endif
#ifndef EVICT_OK
#define EVICT_OK (evicts < EVICTS) /* stop_and_wait's deadline: within the eviction budget */
#endif
#ifdef TRACE
#define LAST_STABLE 1
#else
/* The same assumption for a crash whose join is still in flight: a prepare would name the dead
 * incarnation, and that join then makes the attempt obsolete. A crashed member's join always
 * arrives before its attempt's stop ends (STOPPED), but a receiver the attempt did not name
 * stops nothing: so the transition's last attempt is prepared only once the roster holds every
 * live incarnation it names (members stable). */
#define STABLE(r) (!rok[r] || rinc[r] == inc[r])
#define LAST_STABLE (natt + 1 < MAXA || ALL_R(STABLE))
#endif
#ifndef CHECK
#define CHECK(e) assert(e) /* the model's safety assertions (off only in the reachability run) */
#endif

hidden byte i, j;

/* No XOR is applied on any base other than its own, nor twice. An XOR attempt may carry overwrite
 * payloads (NOVW: the last NOVW of every owner, as cluster.hpp's overwrite_chunks and the engine's
 * tensors a receiver places non-bit-preservingly): those write the target whatever the base. */
#ifdef MUT_OVW_AS_XOR
#define CODED_XOR(a, p) (a_mode[a] == XOR)
#else
#define CODED_XOR(a, p) (a_mode[a] == XOR && (p) % NS + NOVW < NS)
#endif
inline apply_write(a, r, p) {
  if
  :: CODED_XOR(a, p) ->
     CHECK(reg[(r) * NP + (p)] == a_base[(a) * NO + (p) / NS]);
     reg[(r) * NP + (p)] = (reg[(r) * NP + (p)] == a_base[(a) * NO + (p) / NS] -> a_target[a] : GARBAGE)
  :: else -> reg[(r) * NP + (p)] = a_target[a]
  fi
}

/* The commit check, at the moment the log writes K: K's version increases by one, from the
 * previous K, for a live attempt every member acked, and every member (same incarnation) holds
 * exactly v+1 in every region (bit-exactness). */
inline commit_check(a, target) {
  CHECK(Kv + 1 == target);
  CHECK(!a_obsolete[a]);
  CHECK(ghost_acked[a] == a_mem[a]);
  i = 0;
  do
  :: i < NR ->
     if
     :: inc[i] == a_inc[(a) * NR + i] ->
        j = 0;
        do
        :: j < NP -> CHECK(reg[i * NP + j] == target); j++
        :: else -> break
        od
     :: else -> skip
     fi;
     i++
  :: else -> break
  od;
  i = 0; j = 0
}

/* The roster no longer holds receiver r as a member (evicted, not at K, or a new coordinator's
 * empty roster); its incarnation is then read nowhere, so it is cleared (fewer states). */
#ifdef MUT_KEEP_DEAD_INCARNATION
/* ...except that this mutation reads the incarnation of an entry that cannot be named (evicted,
 * lagging): C++ keeps such entries; only a new coordinator's roster has none for a non-member */
#define FORGET(r) rok[r] = 0
#define UNKNOWN(r) rok[r] = 0; rinc[r] = 0; rknown[r] = 0
#define AND_KNOWN(r) ; rknown[r] = 1
#else
#define FORGET(r) rok[r] = 0; rinc[r] = 0
#define UNKNOWN(r) FORGET(r)
#define AND_KNOWN(r) /* nothing: the unmutated model has no rknown */
#endif

#ifdef MUT_OLD_INCARNATION_ACKS
/* broken: the commit marks a member at K by receiver id, so a newer incarnation the roster took
 * during the attempt (restored to the previous K) is believed to hold the new one */
#define NEWER_LEFT_OUT(r) skip
#else
#define NEWER_LEFT_OUT(r) FORGET(r)
#endif
#define LEFT_OUT(a, r) \
  if \
  :: !(a_mem[a] & (1 << (r))) -> FALL_BEHIND(r); FORGET(r) \
  :: else -> if :: rinc[r] != a_inc[(a) * NR + (r)] -> NEWER_LEFT_OUT(r) :: else -> skip fi \
  fi

/* A new coordinator's roster: the members of the last persisted attempt, with the incarnations it
 * names (coordinator.hpp, recovery), unless that attempt was aborted (its members stay evicted);
 * every other receiver is unknown until its join answers the roll call. */
#define RECALL(r) \
  if \
  :: (a_mem[cur] & (1 << (r))) && !cur_aborted -> rok[r] = 1; rinc[r] = a_inc[cur * NR + (r)] AND_KNOWN(r) \
  :: else -> UNKNOWN(r) \
  fi

/* The log writes K for attempt a: a receiver the attempt does not name is now behind (it holds
 * the previous K), and the roster holds as at K only the incarnations the attempt named. */
inline log_commit(a, target) {
  commit_check(a, target);
  Kv = target; Katt = a;
#define LEFT_OUT_OF_A(r) LEFT_OUT(a, r)
  SEQ_R(LEFT_OUT_OF_A)
}

/* Owner o's payloads of the current attempt, one copy to every member. */
#define SEND_PAYLOADS(o) \
  i = 0; \
  do \
  :: i < NR * NS -> \
     if :: a_mem[cur] & (1 << (i / NS)) -> BAG(cur, i / NS, o * NS + i % NS)++ :: else -> skip fi; i++ \
  :: else -> break \
  od; \
  i = 0

#if SRESTARTS > 0
/* The transition's first attempt freezes the trainer's bits (durably: F); a retry sends from that
 * image, and an owner without it answers frozen_lost (owner.hpp: receivers may hold a mix of K.v
 * and those very bits). An image is the named one or none (a restart that leaves other bits of the
 * version, "replaced", leaves none the prepare names: IMAGE_AS_RUN). Where an owner freezes, it
 * freezes the named bits (the C++ monitor "froze the trainer's current bits, not the ones its
 * prepare names"). */
#ifdef MUT_REFREEZE_AT_RESTART
#define RETRY_WITHOUT_IMAGE(o) F[o] = tflav + 1; CHECK(F[o] == named + 1) /* broken: freezes the trainer's bits now */
#else
#define RETRY_WITHOUT_IMAGE(o) skip /* it answers frozen_lost (owner_freeze_send) */
#endif
#define FREEZE_OR_LOSE(o) \
  if \
  :: natt == 1 -> F[o] = tflav + 1; CHECK(F[o] == named + 1) \
  :: natt > 1 && F[o] == 0 -> RETRY_WITHOUT_IMAGE(o) \
  :: else -> skip \
  fi
#endif

/* Owner o: freezes the change set at prepare (against K.v) and sends its NS payloads to every
 * member; it advances its baseline idempotently when it reads the new commit record. */
inline owner_freeze_send(o) {
  if :: B[o] + 1 == Kv -> B[o] = Kv :: else -> skip fi; /* reads K with the prepare */
  CHECK(B[o] == Kv); /* version alignment: B^v is the committed baseline */
#ifdef MUT_DELTA_UNCOMMITTED
  B[o] = a_target[cur];
#endif
  a_base[cur * NO + o] = B[o];
#if SRESTARTS > 0
  FREEZE_OR_LOSE(o);
  if :: F[o] != 0 -> SEND_PAYLOADS(o) :: else -> flost = 1 fi
#else
  SEND_PAYLOADS(o)
#endif
}

#if OCRASHES > 0
/* Owner o takes a copy of attempt a's prepare (persisted before its crash) as new: owner.hpp's
 * on_msg(prepare) past its highest_seen check. A prepare of a sender process that is gone is
 * ignored (finding H1), and so is one whose target is not above B (finding B3: a late copy of a
 * committed attempt would take "v+1" from the trainer's current bits and overwrite K.v's image at
 * the next advance). What passes both is an attempt of the transition in progress, persisted by
 * this sender process: its first attempt froze the image the owner holds (F), so it re-sends from
 * it, or a retry's owner without it answers frozen_lost, which the coordinator ignores for any
 * attempt but its current one, which already has its answer. Where the owner has no image for a
 * transition's first attempt, it freezes the trainer's bits now: the C++ monitor's two checks are
 * the assertions (its target above B, and the bits the prepare names). */
#if SRESTARTS > 0
#define EPOCH_GONE(o, a) (a_epoch[a] < oepoch[o])
#define LATE_FREEZE(o, a) \
  if \
  :: a_mode[a] == XOR && F[o] == 0 -> F[o] = tflav + 1; CHECK(a_named[a] == tflav) \
  :: else -> skip \
  fi
#else
#define EPOCH_GONE(o, a) false
#define LATE_FREEZE(o, a) skip
#endif
#ifdef MUT_FREEZE_STALE_PREPARE
#define STALE_TARGET(o, a) false /* broken: a target not above B is frozen too */
#else
#define STALE_TARGET(o, a) (a_target[a] <= B[o])
#endif
#ifdef MUT_OWNER_FORGETS_SENDER_EPOCH
#define FORGET_SENDER_EPOCH(o) oepoch[o] = 0 /* broken: the crash loses which sender it belongs to */
#else
#define FORGET_SENDER_EPOCH(o) skip
#endif
inline late_prepare(o, a) {
  if
  :: EPOCH_GONE(o, a) -> skip
  :: else ->
     if
     :: STALE_TARGET(o, a) -> skip
     :: else -> CHECK(a_target[a] > B[o]); LATE_FREEZE(o, a)
     fi
  fi
}
/* which attempt's copy: the run's (E_LATE_PREP's y), or any persisted one */
#ifdef TRACE
#define LATE_EV(o) (EVK(E_LATE_PREP, o) && (TAIL || (ev_y[tp] >= 1 && ev_y[tp] <= cur)))
#define PICK_LATE if :: !TAIL -> j = ev_y[tp] :: else -> j = 1; do :: j < cur -> j++ :: break od fi
#else
#define LATE_EV(o) true
#define PICK_LATE j = 1; do :: j < cur -> j++ :: break od
#endif
#endif

proctype owner(byte o) {
end:
  do
  /* the commit announcement (or a read of K): idempotent */
  :: atomic { B[o] + 1 == Kv && phase == IDLE -> B[o] = Kv }
#if OCRASHES > 0
  /* an owner crash: only highest_seen is lost (and, broken, the sender epoch) */
  :: atomic { ocrashes < OCRASHES && EV(E_OCRASH, o, 0) -> NEXT; ocrashes++; ocrashed[o] = 1; FORGET_SENDER_EPOCH(o) }
  :: atomic { ocrashed[o] && cur > 0 && LATE_EV(o) ->
       PICK_LATE; NEXT; late_prepare(o, j); j = 0 }
#endif
  od
}

/* Receiver r has stopped attempt cur, as stop_and_wait counts it. The incarnation cur names is
 * live: it is not in cur, no write of cur is queued on its device, and it has heard of cur (a
 * prepare still in flight could otherwise admit it later). It is dead: the newer incarnation's join
 * has reached the coordinator (it counts as the dead one's stop). */
#define STOPPED(r) (!(a_mem[cur] & (1 << (r))) || \
                    (inc[r] != a_inc[cur * NR + (r)] -> rok[r] && rinc[r] == inc[r] : \
                     (heard[r] >= cur && act[r] != cur && PEND(cur, r) == 0)))
/* The incarnation of r that cur names is fenced: the roster no longer names it, and the live
 * receiver, if that incarnation, is behind. */
#define FENCE(r) \
  if :: rinc[r] == a_inc[cur * NR + (r)] -> FORGET(r) :: else -> skip fi; \
  if :: inc[r] == a_inc[cur * NR + (r)] -> FALL_BEHIND(r) :: else -> skip fi
/* stop_and_wait's deadline passed: a member that has not stopped is evicted. */
#define EVICT(r) if :: !STOPPED(r) -> FENCE(r) :: else -> skip fi
/* The abort of cur is persisted: every member's incarnation is fenced (its bits are a mix of v
 * and v+1; it restores K densely and joins again as a new incarnation), and the transition is
 * over: the next attempt is the first of a fresh one (XOR on K.v, which only non-members and
 * restored receivers hold). */
#ifdef MUT_ABORT_KEEPS_MEMBERS
#define ABANDON(r) skip
#else
/* A live member told of the abort (the incarnation it names) must find it in the log: an abort
 * is a decision like a commit, and one the log does not hold may be undone by a coordinator that
 * takes over and recovers the attempt (finding B6; the C++ monitor's "aborted ... on an abort the
 * commit log does not hold"). */
#define ABANDON(r) \
  if \
  :: a_mem[cur] & (1 << (r)) -> CHECK(cur_aborted || inc[r] != a_inc[cur * NR + (r)]); FENCE(r) \
  :: else -> skip \
  fi
#endif
/* The recovered attempt is stopped: read_commit closes it in the log and tells whether it
 * committed (then the transition is over; else the next attempt retries it). */
#define RECOVERED \
  log_closed = cur; \
  if :: Katt == cur -> ntrans++; natt = 0 :: else -> skip fi; \
  phase = IDLE
#ifdef MUT_UNFENCED_ABORT
/* broken (the twin of the C++ unfenced_abort): the members are told at once, and the log never
 * learns of the abort */
#define PERSIST_ABORT skip
#else
#define PERSIST_ABORT cur_aborted = 1 /* persisted (fenced by epoch: only this coordinator's) first */
#endif
#define ABORT_DONE PERSIST_ABORT; SEQ_R(ABANDON); natt = 0; phase = IDLE
#define ALL_STOPPED ALL_R(STOPPED)

/* The deadline of stop_and_wait can pass only while someone has not stopped (in trace mode the
 * run decides: the model's STOPPED may hold a step earlier than the C++ coordinator learns it). */
#ifdef TRACE
#define SOME_UNSTOPPED 1
#else
#define SOME_UNSTOPPED !ALL_STOPPED
#endif
/* The roster's members now (bitmask); in trace mode the run names them (a subset: the C++
 * roster may not have heard a join yet that the model's has). */
#define ROK(r) rok[r]
#define ROSTER BITS_R(ROK)
#ifdef TRACE
#define MEMBERS (TAIL -> ROSTER : ev_y[tp])
#else
#define MEMBERS ROSTER
#endif

/* Receiver r's live incarnation has a join for the roster to take: one the roster does not hold
 * as a member (a restart, a restore after eviction, or a new coordinator that does not know it),
 * and not behind (it restores first). DEAD_MEMBER: the attempt names a dead incarnation of r. */
#define DEAD_MEMBER(r) ((a_mem[cur] & (1 << (r))) && a_inc[cur * NR + (r)] != inc[r])
#ifdef MUT_EVICTED_REJOINS
#define JOINS(r) (rinc[r] != inc[r] || !rok[r])
#elif defined(MUT_KEEP_DEAD_INCARNATION)
/* broken: a newer incarnation of a receiver the roster knows is ignored (every copy of its join) */
#define JOINS(r) (!behind[r] && (rinc[r] != inc[r] || !rok[r]) && !(rknown[r] && rinc[r] < inc[r]))
#elif defined(MUT_JOIN_CONFIRMED_BY_ANY_ANNOUNCE)
/* broken: a receiver whose join was lost takes the next announce of the K it holds, whoever it
 * names, for the join's confirmation (finding B2's old rule), and stops joining (jgone, set at the
 * loss: JOIN_LOST) until it restarts */
#define JOINS(r) (!behind[r] && !jgone[r] && (rinc[r] != inc[r] || !rok[r]))
#else
#define JOINS(r) (!behind[r] && (rinc[r] != inc[r] || !rok[r]))
#endif
/* the roster takes r's join (below: when) */
#ifdef MUT_OLD_INCARNATION_ACKS
/* A restarted receiver restores K densely before it joins (receiver.hpp: boot, read_commit,
 * dense_restore, join). The model defers that restore to its next admission (stale), which reads
 * the K the join would have named whenever the roster can name it: a commit in between leaves it
 * out (LEFT_OUT). This mutation keeps it named across that commit, so the restore is made here, at
 * the join. */
#define JOIN(r) \
  rinc[r] = inc[r]; rok[r] = 1; \
  if \
  :: stale[r] -> i = 0; do :: i < NP -> reg[(r) * NP + i] = Kv; i++ :: else -> break od; i = 0; stale[r] = 0 \
  :: else -> skip \
  fi
#else
#define JOIN(r) rinc[r] = inc[r]; rok[r] = 1 AND_KNOWN(r)
#endif
/* A new coordinator roll-calls the receivers its roster does not hold (RECALL forgot them). A
 * receiver still in an attempt since its last K (admitted to one not committed, or holding landed
 * writes of one) answers by restoring K densely under a new incarnation and joining with that one:
 * "join at=K" would be a lie that gets its dirty bits admitted to an XOR attempt (finding H2;
 * receiver.hpp, roll call); any other answers with a join of the incarnation it is.
 * MUT_JOIN_MID_ATTEMPT answers with the old incarnation, as the C++ mutation join_mid_attempt does
 * (and MUT_EVICTED_REJOINS, which keeps its bits at any join). The exhaustive runs take the roll
 * call with the join that answers it (JOIN_STEP of a receiver the roster forgot; a receiver there is
 * never in an attempt, checked with an assertion: proofs/README.md); in trace mode its arrival is an
 * event of its own (E_ROLL_CALL), because C++ delivers it whenever the network does, also to a
 * receiver that joined since (after a restart) and was admitted to an attempt. */
#define AT_K(r, p) ((p) >= NP || reg[(r) * NP + (p)] == Kv)
#define IN_ATTEMPT(r) ((act[r] != 0 && act[r] != Katt) || \
                       (!stale[r] && !(AT_K(r, 0) && AT_K(r, 1) && AT_K(r, 2) && AT_K(r, 3))))
#if defined(MUT_JOIN_MID_ATTEMPT) || defined(MUT_EVICTED_REJOINS)
#define ANSWER_ROLL_CALL(r) skip
#else
/* A member of the committed attempt (act = Katt) is in it too until it hears of the commit, which
 * the model does not track: it may restart or not; so may one between attempts since it stopped
 * the one that committed. One between attempts since it stopped any other restarts (receiver.hpp:
 * `between` is in_attempt; found by the trace check: late_roll_call_restores_a_receiver_between_
 * attempts.txt). */
#ifdef TRACE
#define BETWEEN(r) (btw[r] != 0)
#define SURELY_BETWEEN(r) (btw[r] != 0 && btw[r] != Katt)
#else
#define BETWEEN(r) false
#define SURELY_BETWEEN(r) false
#endif
#define ANSWER_ROLL_CALL(r) \
  if \
  :: IN_ATTEMPT(r) || act[r] != 0 || BETWEEN(r) -> RESTART(r) \
  :: !IN_ATTEMPT(r) && !SURELY_BETWEEN(r) -> skip \
  fi
#endif
#ifdef TRACE
#define JOIN_ANSWERS(r) skip
#else
#define JOIN_ANSWERS(r) if :: !rok[r] -> ANSWER_ROLL_CALL(r) :: else -> skip fi
#endif
#define JOIN_STEP(r) \
  :: atomic { JOINS(r) && (phase == IDLE || phase != TRANSFER && DEAD_MEMBER(r)) -> JOIN_ANSWERS(r); JOIN(r) }
/* A join that a dead incarnation of r sent (before its crash or restore) reaching a roster that
 * does not know r since (a new coordinator's): C++ takes it (coordinator.hpp: any incarnation not
 * older than the known one), so the roster names an incarnation that can never admit an attempt
 * until the live one's join arrives (E_REJOIN during transfer). The model's own join step takes
 * the live incarnation, so this one comes from the run (E_STALE_JOIN, y = how many incarnations
 * back), in trace mode only: the exhaustive runs reach a prepare naming a dead incarnation by the
 * roster's lag (a crash before the join of the newer incarnation arrives) instead. Found by
 * `bitrefit-spin-trace --random=100 --seed=15` (run 67: r0#0's answer to a roll call reaches the
 * next coordinator after r0 crashed). */
#ifdef TRACE
#define STALE_JOIN_STEP(r) \
  :: atomic { tp < TLEN && ev_k[tp] == E_STALE_JOIN && ev_x[tp] == (r) && ev_y[tp] >= 1 && inc[r] >= ev_y[tp] -> \
       rinc[r] = inc[r] - ev_y[tp]; rok[r] = 1 AND_KNOWN(r); NEXT }
#endif
#define REJOINS(r) (JOINS(r) && (a_mem[cur] & (1 << (r))))
#define REJOIN_BRANCH(r) :: REJOINS(r) -> JOIN(r)

/* An abort within the budget, or the one an owner's frozen_lost asks for (not budgeted: a sender
 * restart's cost; in trace mode the run's own aborts include it, so only the free tail takes it). */
#if SRESTARTS > 0
#ifdef TRACE
#define FLOST_ABORT (TAIL && flost)
#else
#define FLOST_ABORT flost
#endif
#define ABORT_OK (aborts < ABORTS || FLOST_ABORT)
#define COUNT_ABORT if :: FLOST_ABORT -> flost = 0 :: else -> aborts++ fi
#else
#define ABORT_OK (aborts < ABORTS)
#define COUNT_ABORT aborts++
#endif

/* A claim just made (the first coordinator's, or a failover's) may take effect in the log and lose
 * its reply (a claim fault, CFAULTS). The coordinator reads the log's epoch back, finds its own and
 * goes on as claimed: nothing else changes. The mutation claims the same epoch again instead, which
 * the log fences (the epoch is no longer above the log's): the coordinator deposes itself. In
 * trace mode the run says which (E_CLAIM_UNKNOWN right after the claim's own event, if any). */
#if CFAULTS > 0
byte cfaults = 0;
bit started = 0; /* init has loaded the trace: the first coordinator's claim may now be judged */
#ifdef MUT_RECLAIM_UNKNOWN_EPOCH
#define CLAIM_UNKNOWN phase = DEPOSED
#else
#define CLAIM_UNKNOWN skip
#endif
#ifdef TRACE
#define NOT_NEXT_EV(k) (TAIL || !(tp < TLEN && ev_k[tp] == (k)))
#else
#define NOT_NEXT_EV(k) true
#endif
#define CLAIM_FAULT \
  if \
  :: cfaults < CFAULTS && EV(E_CLAIM_UNKNOWN, 0, 0) -> NEXT; cfaults++; CLAIM_UNKNOWN \
  :: NOT_NEXT_EV(E_CLAIM_UNKNOWN) -> skip \
  fi
#else
#define CLAIM_FAULT skip
#endif

/* ---------------------------------------------------------------------------------------- */
active proctype coordinator() {
#if CFAULTS > 0
  atomic { started -> CLAIM_FAULT }; /* the first coordinator's claim */
#endif
end:
  do
  /* prepare: persist the attempt (mode, target, bound incarnations), fenced by epoch */
  :: d_step { phase == IDLE && ntrans < NTRANS && epoch == log_epoch && EVK(E_PREP, 0) && (MEMBERS & ~ROSTER) == 0 &&
              LAST_STABLE ->
       a_mem[cur + 1] = MEMBERS;
       NEXT; natt++; cur++; cur_aborted = 0;
#ifdef MUT_XOR_RETRY
       a_mode[cur] = XOR;
#else
       a_mode[cur] = (natt == 1 -> XOR : OVW);
#endif
       a_target[cur] = Kv + 1;
#if SRESTARTS > 0
       if :: natt == 1 -> named = tflav :: else -> skip fi; /* the transition's prepares name these bits */
       flost = 0;
#endif
#if OCRASHES > 0 && SRESTARTS > 0
       a_epoch[cur] = epoch; a_named[cur] = named;
#endif
       i = 0;
       do
       :: i < NR -> a_inc[cur * NR + i] = (a_mem[cur] & (1 << i) -> rinc[i] : NOMEM); i++
       :: else -> break
       od;
       SEQ_O(owner_freeze_send);
       acks = 0; rep = R_NONE;
       phase = TRANSFER }
  /* every member acked: compare-and-set from (v, g) to (v+1, g') */
#ifdef MUT_COMMIT_EARLY
  :: atomic { phase == TRANSFER && acks != 0 ->
#else
  :: atomic { phase == TRANSFER && acks == a_mem[cur] ->
#endif
       req_att = cur; req_epoch = epoch; req_target = a_target[cur]; req = 1; rep = R_NONE;
       phase = COMMITTING }
  /* deadline passed during transfer: mark_obsolete, then stop_and_wait */
  :: atomic { phase == TRANSFER && CAN_TIME_OUT && EV(E_DEADLINE, 0, 0) -> NEXT; a_obsolete[cur] = 1; phase = STOPPING }
  /* abort (an operator's, or an owner that lost the frozen change set): mark_obsolete,
   * stop_and_wait, then the abort is persisted before anyone is told (ABORT_DONE) */
  :: atomic { phase == TRANSFER && ABORT_OK && EV(E_ABORT, 0, 0) -> NEXT; COUNT_ABORT; a_obsolete[cur] = 1; phase = ABORTING }
  /* The join of a restarted receiver's newer incarnation reaches the coordinator: only now does
   * the roster (rinc) know it, so a prepare persisted in between names the dead incarnation, which
   * can never admit it. During transfer the attempt names the dead incarnation (a_inc = rinc at
   * prepare): it can never get its ack, so it is obsolete at once (E_REJOIN); during
   * stop_and_wait the join counts as the dead incarnation's stop (STOPPED) (coordinator.hpp; the
   * rule was found missing here by the trace check, the roster's lag later: proofs/README.md
   * "Spin tied to the code") */
  /* A join the roster takes as it is: a member's newer incarnation while its attempt is stopped or
   * committed (it counts as the dead one's stop), or any other join (a receiver the attempt does
   * not name, an answer to a new coordinator's roll call), which the model takes only while idle:
   * until the next prepare nothing reads a roster entry that names no member, so a join that
   * arrives earlier in C++ reaches the same states (a commit in between leaves it behind either
   * way, a failover forgets it). */
  OPT_R(JOIN_STEP)
#ifdef TRACE
  OPT_R(STALE_JOIN_STEP)
#endif
  :: atomic { phase == TRANSFER && ANY_R(REJOINS) && EV(E_REJOIN, 0, 0) ->
       NEXT;
       if
       OPT_R(REJOIN_BRANCH)
       fi;
#ifdef MUT_OLD_INCARNATION_ACKS
       skip /* broken: the attempt stays live, and an ack the dead incarnation gave still counts */
#else
       a_obsolete[cur] = 1; phase = STOPPING
#endif
     }
  :: atomic { phase == COMMITTING && rep == R_SUCCESS ->
       rep = R_NONE; ntrans++; natt = 0; phase = IDLE }
  :: atomic { phase == COMMITTING && rep == R_FAILED ->
       rep = R_NONE; a_obsolete[cur] = 1; phase = STOPPING }
  /* outcome unknown (reply lost): read_commit closes the attempt in the log, then decides */
  :: atomic { phase == COMMITTING && rep == R_LOST ->
       rep = R_NONE; log_closed = cur;
       if
       :: Katt == cur -> ntrans++; natt = 0; phase = IDLE
       :: else -> a_obsolete[cur] = 1; phase = STOPPING
       fi }
  /* stop_and_wait(cur): no write of cur can still take effect anywhere; then cleanup and retry */
#ifdef MUT_NO_STOP
  :: atomic { phase == STOPPING -> phase = IDLE }
#else
  :: atomic { phase == STOPPING && ALL_STOPPED -> phase = IDLE }
#endif
  :: atomic { phase == ABORTING && ALL_STOPPED -> ABORT_DONE }
  /* after failover: mark_obsolete, stop_and_wait, then read_commit on the old attempt */
  :: atomic { phase == RECOVERING && ALL_STOPPED -> RECOVERED }
  /* stop_and_wait's deadline (after a retry's or a recovery's mark_obsolete): members not stopped
   * are evicted, and the stop ends as above */
  :: atomic { (phase == STOPPING || phase == RECOVERING || phase == ABORTING) && EVICT_OK && SOME_UNSTOPPED &&
              EV(E_EVICT, 0, 0) ->
       NEXT; evicts++;
       SEQ_R(EVICT);
       if
       :: phase == RECOVERING -> RECOVERED
       :: phase == ABORTING -> ABORT_DONE
       :: else -> phase = IDLE
       fi }
  od
}

active proctype commit_log() {
end:
  do
  :: atomic { req && EV(E_CAS, 0, 1) ->
       NEXT; req = 0;
#ifdef MUT_BLIND_WRITE
       log_commit(req_att, req_target);
       if :: req_epoch == epoch -> rep = R_SUCCESS :: else -> skip fi
#else
       if
       :: req_epoch == log_epoch && req_att > log_closed && Kv + 1 == req_target ->
          log_commit(req_att, req_target);
          if :: req_epoch == epoch -> rep = R_SUCCESS :: else -> skip fi
       :: else ->
          if :: req_epoch == epoch -> rep = R_FAILED :: else -> skip fi
       fi
#endif
     }
  /* written, but the reply is lost: outcome unknown */
  :: atomic { req && CAN_FAIL && req_epoch == log_epoch && req_att > log_closed && Kv + 1 == req_target &&
              EV(E_CAS, 0, 2) ->
       NEXT; req = 0;
       log_commit(req_att, req_target);
       if :: req_epoch == epoch -> rep = R_LOST :: else -> skip fi }
  /* not written (transient failure): confirmed failed, or unknown */
  :: atomic { req && CAN_FAIL && EV(E_CAS, 0, 3) -> NEXT; req = 0; if :: req_epoch == epoch -> rep = R_FAILED :: else -> skip fi }
  :: atomic { req && CAN_FAIL && EV(E_CAS, 0, 4) -> NEXT; req = 0; if :: req_epoch == epoch -> rep = R_LOST :: else -> skip fi }
  od
}

/* Ingest one copy of payload p of attempt a: older attempts are dropped, verified duplicates are
 * ignored (dedup), new ones are decoded and applied (or queued on the device). A copy whose first
 * instance is still queued waits (only matters without dedup).
 * A copy of an attempt newer than the receiver's waits until the receiver has admitted that
 * attempt's prepare. This is what the real receiver does (receiver.hpp, "Early messages": it keeps
 * the payloads, open and flush of the next attempt and replays them at admission). If such a copy
 * were dropped instead ("other attempt"), the last allowed attempt could lose a payload to that
 * race with no fault budget left, and both spin's liveness check and the C++ checker find exactly
 * that (a transition that never ends). */
#ifdef MUT_DEDUP_OFF
#define DUP_IGNORED(p) 0
#else
#define DUP_IGNORED(p) (seen[r] & (1 << (p)))
#endif
#ifdef DEVICE_QUEUE
/* decoded writes are queued on the device and land later, in any order (needed to show why
 * stop_and_wait exists) */
#define QUEUE_OR_APPLY(a, p) PEND(a, r) = PEND(a, r) | (1 << (p))
#else
/* synchronous decode: the write lands as the copy is ingested (fewer interleavings) */
#define QUEUE_OR_APPLY(a, p) apply_write(a, r, p)
#endif
#define INGEST(a, p) \
  :: atomic { (a) <= NATT && (p) < NP && (a) <= act[r] && BAG(a, r, p) > 0 && \
              !((a) == act[r] && (PEND(a, r) & (1 << (p)))) && EV(E_INGEST, r, (a) * 8 + (p)) -> \
       NEXT; BAG(a, r, p)--; \
       if \
       :: (a) == act[r] && !DUP_IGNORED(p) -> seen[r] = seen[r] | (1 << (p)); QUEUE_OR_APPLY(a, p) \
       :: else -> skip \
       fi }
/* A queued write lands on the device (in any order; it does not look at act: it is already issued). */
#ifdef DEVICE_QUEUE
#define APPLY(a, p) \
  :: atomic { (a) <= NATT && (p) < NP && (PEND(a, r) & (1 << (p))) -> \
       PEND(a, r) = PEND(a, r) & ~(1 << (p)); apply_write(a, r, p) }
#else
#define APPLY(a, p)
#endif

/* Receiver r admits attempt a (one of this transition's, bound to its incarnation): a restarted
 * receiver dense-restores K.v first; the version alignment is checked; copies of older attempts
 * would be dropped on arrival: drop them now (same effect, fewer interleavings). */
#define ADMIT(a) \
  i = 0; \
  do \
  :: i < NP -> \
     if :: stale[r] -> reg[r * NP + i] = Kv :: else -> skip fi; \
     if \
     :: a_mode[a] == XOR -> CHECK(reg[r * NP + i] == Kv) \
     :: else -> CHECK(reg[r * NP + i] == Kv || reg[r * NP + i] == Kv + 1) \
     fi; \
     i++ \
  :: else -> break \
  od; \
  i = 0; \
  do :: i < (a) * NP -> bag[(i / NP * NR + r) * NP + i % NP] = 0; i++ :: else -> break od; \
  i = 0; \
  CLEAR_BETWEEN(r); stale[r] = 0; act[r] = a; heard[r] = a; seen[r] = 0; acked[r] = 0
#define ADMIT_OLDER(a) \
  :: atomic { (a) <= NATT && (a) < cur && (a) > heard[r] && a_inc[(a) * NR + r] == inc[r] && a_target[a] == Kv + 1 && \
              EV(E_ADMIT, r, a) -> NEXT; ADMIT(a) }
#ifdef MUT_ADMIT_CURRENT_ONLY
#define OLDER_ATTEMPTS(M)
#else
#define OLDER_ATTEMPTS(M) M(1) M(2) M(3) M(4) M(5)
#endif
proctype receiver(byte r) {
end:
  do
  /* admission to the prepared attempt (bound incarnation); a restarted receiver dense-restores
   * to K.v first. Version alignment: XOR needs every region exactly at K.v; an overwrite retry
   * accepts any mix of v and v+1 in the frozen positions. */
  /* The prepare may still be in flight when the coordinator gives the attempt up (deadline,
   * failover, failed commit): the receiver then admits it all the same, and stops on the
   * mark_obsolete that follows, unless that arrived first (heard). That holds after the stop
   * too: a member evicted at stop_and_wait's deadline may admit the given-up attempt once the
   * coordinator is idle, before it learns it is behind (found by the trace check with 3
   * receivers; exhaustive runs restore an evicted member at once, so only trace mode gets here). */
  :: atomic { (phase != IDLE || a_obsolete[cur]) && cur > heard[r] && a_inc[cur * NR + r] == inc[r] &&
              EV(E_ADMIT, r, cur) -> NEXT; ADMIT(cur) }
  /* ...and so may the prepare of an older attempt of this transition, after a newer one was
   * prepared: a late copy to a receiver that heard neither it nor anything newer, which only a
   * receiver not waited for can be (evicted or fenced, not yet told; a dead coordinator's, whose
   * successor did not know it). receiver.hpp admits it too unless it heard a newer coordinator's
   * roll call or abort (the model does not track those: it admits more, never less). Exhaustive
   * runs never get here: a receiver not waited for restores at once (FALL_BEHIND), and every
   * other member of an attempt heard it before the next was prepared (STOPPED). */
  OLDER_ATTEMPTS(ADMIT_OLDER)
  INGEST(1, 0) INGEST(1, 1) INGEST(1, 2) INGEST(1, 3)
  INGEST(2, 0) INGEST(2, 1) INGEST(2, 2) INGEST(2, 3)
  INGEST(3, 0) INGEST(3, 1) INGEST(3, 2) INGEST(3, 3)
  INGEST(4, 0) INGEST(4, 1) INGEST(4, 2) INGEST(4, 3)
  INGEST(5, 0) INGEST(5, 1) INGEST(5, 2) INGEST(5, 3)
  INGEST(6, 0) INGEST(6, 1) INGEST(6, 2) INGEST(6, 3)
  APPLY(1, 0) APPLY(1, 1) APPLY(1, 2) APPLY(1, 3)
  APPLY(2, 0) APPLY(2, 1) APPLY(2, 2) APPLY(2, 3)
  APPLY(3, 0) APPLY(3, 1) APPLY(3, 2) APPLY(3, 3)
  APPLY(4, 0) APPLY(4, 1) APPLY(4, 2) APPLY(4, 3)
  APPLY(5, 0) APPLY(5, 1) APPLY(5, 2) APPLY(5, 3)
  APPLY(6, 0) APPLY(6, 1) APPLY(6, 2) APPLY(6, 3)
  /* flush: every payload applied and the device drained, then ack (τ) */
  :: atomic { act[r] != 0 && !acked[r] && seen[r] == ALLP && PEND(act[r], r) == 0 && EVK(E_ACK, r) ->
       ghost_acked[act[r]] = ghost_acked[act[r]] | (1 << r); acked[r] = 1;
       if
       :: phase == TRANSFER && act[r] == cur && EVY(0) -> acks = acks | (1 << r) /* delivered, accepted */
       :: phase == TRANSFER && act[r] == cur && drops < DROPS && CAN_FAIL && EVY(1) -> drops++ /* lost */
       :: else -> skip /* another attempt's ack: ignored */
       fi;
       NEXT }
  /* told of mark_obsolete: stop once the device has drained the attempt's writes */
  :: atomic { act[r] != 0 && a_obsolete[act[r]] && PEND(act[r], r) == 0 -> SET_BETWEEN(r); act[r] = 0 }
  /* told of mark_obsolete before the prepare arrived: the prepare will be ignored, and the
   * receiver reports itself stopped */
  :: atomic { a_obsolete[cur] && cur > heard[r] && a_inc[cur * NR + r] == inc[r] -> heard[r] = cur }
  /* evicted, or left out of a commit (told so by an announcement): restore K densely under a new
   * incarnation (the restore waits for the device), then join again */
#ifdef TRACE
  :: atomic { behind[r] -> RESTART(r) }
  /* a new coordinator's roll call arrives (JOIN_STEP above) */
  :: atomic { ROLL_CALL_OK && EV(E_ROLL_CALL, r, 0) -> NEXT; ANSWER_ROLL_CALL(r) }
#endif
  od
}

/* Faults, each within its budget. */
#define DROP(r, p) \
  :: atomic { drops < DROPS && CAN_FAIL && (p) < NP && BAG(cur, r, p) > 0 && EV(E_DROP, r, p) -> NEXT; BAG(cur, r, p)--; drops++ }
#define DUP(r, p) \
  :: atomic { dups < DUPS && (p) < NP && BAG(cur, r, p) > 0 && EV(E_DUP, r, p) -> NEXT; BAG(cur, r, p)++; dups++ }
#define DROPS_TO(r) DROP(r, 0) DROP(r, 1) DROP(r, 2) DROP(r, 3)
#define DUPS_TO(r) DUP(r, 0) DUP(r, 1) DUP(r, 2) DUP(r, 3)
/* A receiver's join is lost (a drop) while it waits for the confirmation. The shipped receiver
 * joins again when an announce does not name it (receiver.hpp): JOINS still holds, nothing to
 * model, so only trace mode has the step (to follow the run's event). The mutation takes that
 * announce (the commit's, or the next one) for the confirmation: the model gives the join up at its
 * loss. */
#ifdef MUT_JOIN_CONFIRMED_BY_ANY_ANNOUNCE
#define JOIN_LOST(r) \
  :: atomic { drops < DROPS && CAN_FAIL && JOINS(r) && EV(E_JOIN_LOST, r, 0) -> NEXT; drops++; jgone[r] = 1 }
#elif defined(TRACE)
#define JOIN_LOST(r) :: atomic { JOINS(r) && EV(E_JOIN_LOST, r, 0) -> NEXT }
#else
#define JOIN_LOST(r)
#endif
#define CRASH(r) \
  :: atomic { crashes < CRASHES && CAN_FAIL && FAULT_PHASE_OK && EV(E_CRASH, r, 0) -> \
       NEXT; crashes++; RESTART(r) }

/* A new coordinator takes over: it bumps the epoch (fencing the old one's requests in the log),
 * loses the volatile state, and recovers the attempt it finds persisted. */
#define NEW_COORDINATOR \
  epoch++; log_epoch = epoch; acks = 0; rep = R_NONE; SEQ_R(RECALL); a_obsolete[cur] = 1; phase = RECOVERING
#if SRESTARTS > 0
#define LOSE_IMAGE(o) F[o] = 0
#ifdef MUT_RESTART_LOSES_IMAGES
#define IMAGE_AS_RUN(o) F[o] = 0 /* drift: every image is gone after a restart, whatever the run says */
#else
#define IMAGE_AS_RUN(o) if :: ev_y[tp] & (1 << (o)) -> F[o] = named + 1 :: else -> F[o] = 0 fi
#endif
/* every owner restarts in the new sender process: it has seen every persisted prepare, and belongs
 * to the new coordinator's epoch (owner.hpp, restarted) */
#if OCRASHES > 0
#define OWNER_RESTARTED(o) ocrashed[o] = 0; oepoch[o] = epoch + 1
#define OWNERS_RESTART SEQ_O(OWNER_RESTARTED)
#else
#define OWNERS_RESTART skip
#endif
#endif

active proctype env() {
end:
  do
  OPT_R(DROPS_TO)
  OPT_R(DUPS_TO)
  OPT_R(CRASH)
  OPT_R(JOIN_LOST)
  /* coordinator failover */
  :: atomic { failovers < FAILOVERS && CAN_FAIL && phase != IDLE && EV(E_FAILOVER, 0, 0) ->
       NEXT; failovers++; NEW_COORDINATOR; CLAIM_FAULT }
#if SRESTARTS > 0
#ifdef TRACE
  /* the sender restarts as the run says: which owners kept the named image; its new coordinator's
   * claim is the failover event that follows */
  :: atomic { srestarts < SRESTARTS && tp < TLEN && ev_k[tp] == E_SRESTART ->
       SEQ_O(IMAGE_AS_RUN); OWNERS_RESTART; NEXT; srestarts++; tflav++ }
#else
  /* the sender restarts: a new coordinator, the trainer moved on, and the owners' images kept, or
   * lost where nothing can commit them behind the new coordinator's back (no compare-and-set
   * pending: cluster.hpp frozen_can_vanish) */
  :: atomic { srestarts < SRESTARTS && CAN_FAIL && phase != IDLE ->
       srestarts++; tflav++;
       if :: skip :: !req -> SEQ_O(LOSE_IMAGE) fi;
       OWNERS_RESTART;
       NEW_COORDINATOR; CLAIM_FAULT }
#endif
#endif
#ifdef TRACE
  /* a failover while no attempt is in progress only fences the old epoch */
  :: atomic { failovers < FAILOVERS && phase == IDLE && EV(E_FAILOVER, 0, 0) ->
       NEXT; failovers++; epoch++; log_epoch = epoch; SEQ_R(RECALL); CLAIM_FAULT }
#endif
  od
}

/* Safety in every state: owners' baselines never run ahead of K (B^v moves only after commit). */
#define NOT_AHEAD(o) B[o] <= Kv
active proctype monitor() {
end:
  atomic { !(ALL_O(NOT_AHEAD) && Kv <= NTRANS) -> CHECK(false) }
}

#define RUN_OWNER(o) run owner(o)
#define RUN_RECEIVER(r) run receiver(r)
init {
  atomic {
#ifdef TRACE
    trace_init();
#endif
    SEQ_O(RUN_OWNER);
    SEQ_R(RUN_RECEIVER);
#if CFAULTS > 0
    started = 1
#else
    skip
#endif
  }
}

/* every transition ended, and the roster holds receiver r's live incarnation as a member */
#define CONVERGED(r) (rok[r] && rinc[r] == inc[r])

#ifdef TRACE_GOAL
/* the whole run was followed and then every transition ended and the roster converged: this
 * assertion failing proves the model can end the run as C++ does (the formula below, on one run) */
active proctype trace_goal() {
end:
  atomic { tp == TLEN && ntrans == NTRANS && ALL_R(CONVERGED) -> assert(false) }
}
#elif defined(TRACE_REACH)
/* the whole run was followed: this assertion failing proves the trace is realizable in the model */
active proctype trace_complete() {
end:
  atomic { tp == TLEN -> assert(tp != TLEN) }
}
#endif

/* Liveness (checked with pan -a -f, weak fairness): every transition ends, and then the roster
 * holds every receiver's live incarnation as a member (a restarted, evicted or left-out receiver
 * is readmitted: it joined as that incarnation and can be named). Once both hold, nothing changes
 * either (no prepare is left, and faults need a phase other than idle), so "eventually" is
 * "eventually always". The C++ checker's goal is the same (proofs/README.md, "Liveness covers
 * membership"). */
ltl live { <> (ntrans == NTRANS && ALL_R(CONVERGED)) }
