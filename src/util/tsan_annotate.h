/*
 * ThreadSanitizer annotations (no-ops in other builds).
 *
 * For memory that another process writes or reads one-sided (a peer's
 * shm, cxl or ucx copies, or our own tcp target's thread serving a peer's
 * request), ordered by that peer's protocol: a request, a reply, a line on
 * a pipe.  TSan sees one process and cannot follow such an order, so a
 * thread's own accesses to that memory between BEGIN and END are not
 * checked; every other access in the process still is.  Keep the spans
 * short and say at each one which protocol orders it.
 */
#ifndef FERRY_TSAN_ANNOTATE_H
#define FERRY_TSAN_ANNOTATE_H

#ifdef __SANITIZE_THREAD__
/* libtsan's dynamic annotations */
void AnnotateIgnoreReadsBegin(const char *file, int line);
void AnnotateIgnoreReadsEnd(const char *file, int line);
void AnnotateIgnoreWritesBegin(const char *file, int line);
void AnnotateIgnoreWritesEnd(const char *file, int line);
#define FERRY_TSAN_IGNORE_BEGIN()                                                                 \
    (AnnotateIgnoreReadsBegin(__FILE__, __LINE__), AnnotateIgnoreWritesBegin(__FILE__, __LINE__))
#define FERRY_TSAN_IGNORE_END()                                                                   \
    (AnnotateIgnoreWritesEnd(__FILE__, __LINE__), AnnotateIgnoreReadsEnd(__FILE__, __LINE__))
#else
#define FERRY_TSAN_IGNORE_BEGIN() ((void)0)
#define FERRY_TSAN_IGNORE_END() ((void)0)
#endif

#endif
