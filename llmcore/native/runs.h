/* Runs of rows for llmcore's streaming kernels (onerow.c's one-row kernels, amx.c's prompt
 * kernel): each thread of an OpenMP team takes a share of the rows and reads several runs of
 * its share at once, several places in memory, which this host's memory serves faster than
 * one. Called inside a parallel region. */
#ifndef LLMCORE_RUNS_H
#define LLMCORE_RUNS_H

#include <omp.h>

/* The rows [*first, *end) of n_out that this thread of the team takes (a share each), cut
 * into runs of *run rows, one run per stream: a kernel reads row r of every run at once,
 * `streams` places in memory (GPT-2 small's bfloat16 matrices at 31 GB/s in eight runs
 * against 26 for four adjacent rows at a time, measured together). A row's sums never depend
 * on which rows it is read with. A "row" is the kernel's unit: one output's weights in
 * onerow.c, a block of 16 outputs in amx.c. */
static inline void my_runs(long n_out, long streams, long *first, long *end, long *run) {
    const long t = omp_get_thread_num(), n = omp_get_num_threads();
    *first = n_out * t / n;
    *end = n_out * (t + 1) / n;
    *run = (*end - *first + streams - 1) / streams;
}

/* Row r of run s (see my_runs), or -1 past the share's end. */
static inline long run_row(long first, long end, long run, long s, long r) {
    const long n = first + s * run + r;
    return n < end ? n : -1;
}

/* The row to read for row r of run s: run_row's, or past the share's end row r of the first
 * run again (in cache already; its sums are not stored). */
static inline long row_to_read(long first, long end, long run, long s, long r) {
    const long n = run_row(first, end, run, s, r);
    return n >= 0 ? n : first + r;
}

#endif
