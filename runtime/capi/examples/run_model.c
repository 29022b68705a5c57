/*
 * Runs a one-input f32 model through kiln's C API.
 *
 *   run_model MODEL.kiln INPUT.f32 OUTPUT.f32 DIM...
 *
 * INPUT.f32 holds the input's raw little-endian f32 elements, DIM... its shape.
 * The model is loaded twice, from the path and in place from memory (the
 * memory copy runs it); output 0 is written raw to OUTPUT.f32. Then the error
 * paths: a wrong input shape, a null session, a misaligned artifact must each
 * give an error status and a message, never a crash. Exit status 0 when all
 * of that held.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln.h"

static int fail(const char *what, kiln_status status) {
    fprintf(stderr, "%s: status %d (%s): %s\n", what, (int)status, kiln_status_message(status),
            kiln_last_error_message());
    return 1;
}

/* Reads a whole file into 64-byte aligned memory (the weights are used in place). */
static void *read_aligned(const char *path, size_t *len, size_t slack) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    size_t cap = ((size_t)n + slack + 63) / 64 * 64;
    unsigned char *buf = aligned_alloc(64, cap > 0 ? cap : 64);
    if (buf && fread(buf + slack, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    *len = (size_t)n;
    return buf;
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: %s MODEL.kiln INPUT.f32 OUTPUT.f32 DIM...\n", argv[0]);
        return 2;
    }
    size_t rank = (size_t)(argc - 4);
    int64_t shape[8];
    if (rank > 8) return 2;
    for (size_t i = 0; i < rank; i++) shape[i] = strtoll(argv[4 + i], NULL, 10);

    kiln_program *from_path = NULL;
    kiln_status st = kiln_program_load(argv[1], &from_path);
    if (st != KILN_STATUS_OK) return fail("kiln_program_load", st);

    size_t model_len = 0;
    void *model = read_aligned(argv[1], &model_len, 0);
    if (!model) return 2;
    kiln_program *program = NULL;
    st = kiln_program_from_memory(model, model_len, &program);
    if (st != KILN_STATUS_OK) return fail("kiln_program_from_memory", st);
    if (kiln_program_num_inputs(program) != 1 || kiln_program_num_outputs(program) < 1 ||
        kiln_program_num_inputs(from_path) != 1) {
        fprintf(stderr, "expected a program with one input\n");
        return 1;
    }
    kiln_program_free(from_path);

    size_t input_len = 0;
    void *input = read_aligned(argv[2], &input_len, 0);
    if (!input) return 2;

    kiln_session *session = NULL;
    st = kiln_session_new(program, &session);
    if (st != KILN_STATUS_OK) return fail("kiln_session_new", st);
    /* The session keeps the program alive; the handle may go first. */
    kiln_program_free(program);

    kiln_tensor x = {KILN_DTYPE_F32, rank, shape, input, input_len};
    st = kiln_session_run(session, &x, 1);
    if (st != KILN_STATUS_OK) return fail("kiln_session_run", st);

    kiln_tensor y;
    st = kiln_session_output(session, 0, &y);
    if (st != KILN_STATUS_OK) return fail("kiln_session_output", st);
    printf("output 0: dtype %d rank %zu shape [", (int)y.dtype, y.rank);
    for (size_t i = 0; i < y.rank; i++) printf(i ? ", %lld" : "%lld", (long long)y.shape[i]);
    printf("] bytes %zu\n", y.bytes);
    FILE *out = fopen(argv[3], "wb");
    if (!out || fwrite(y.data, 1, y.bytes, out) != y.bytes) return 2;
    fclose(out);

    /* Error path 1: a wrong input shape (first dimension + 1). */
    int64_t wrong[8];
    memcpy(wrong, shape, rank * sizeof(int64_t));
    wrong[0] += 1;
    kiln_tensor bad = {KILN_DTYPE_F32, rank, wrong, input, input_len};
    st = kiln_session_run(session, &bad, 1);
    if (st == KILN_STATUS_OK) {
        fprintf(stderr, "a wrong input shape was accepted\n");
        return 1;
    }
    printf("wrong shape: status %d (%s): %s\n", (int)st, kiln_status_message(st), kiln_last_error_message());
    /* After a failed run there are no outputs to read. */
    if (kiln_session_output(session, 0, &y) != KILN_STATUS_NO_OUTPUTS) return 1;

    /* Error path 2: null handles. */
    st = kiln_session_run(NULL, &x, 1);
    printf("null session: status %d (%s): %s\n", (int)st, kiln_status_message(st), kiln_last_error_message());
    if (st != KILN_STATUS_INVALID_ARGUMENT) return 1;

    /* Error path 3: the artifact in place at an address that is not 64-byte aligned. */
    size_t shifted_len = 0;
    unsigned char *shifted = read_aligned(argv[1], &shifted_len, 8);
    kiln_program *misaligned = (kiln_program *)(uintptr_t)1; /* not null: a failed call must null it */
    st = kiln_program_from_memory(shifted + 8, shifted_len, &misaligned);
    printf("misaligned: status %d (%s): %s\n", (int)st, kiln_status_message(st), kiln_last_error_message());
    if (st != KILN_STATUS_BAD_ARTIFACT || misaligned != NULL) return 1;
    free(shifted);

    kiln_session_free(session);
    free(input);
    free(model); /* only now: the program used it in place */
    printf("ok\n");
    return 0;
}
