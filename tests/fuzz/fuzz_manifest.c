/*
 * fuzz_manifest.c: libFuzzer target for the checkpoint manifest (COMPLETE) in
 * llmc/formats/checkpoint.h, and the checksum lines that ranks leave beside their
 * files. Any text must either read as a manifest, or as an older build's
 * marker without checksums, or fail with a message naming the file; never a
 * crash, a leak or a read out of bounds (ASan and UBSan watch). A manifest that
 * reads must hold plain file names, each once, and survive a round trip:
 * written back (ckpt_manifest_text) it reads again as the same step, run and
 * files. Build and run: make test-fuzz (tests/fuzz/run.sh).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmc/formats/checkpoint.h"

static void fuzz_assert(int ok, const char *what)
{
    if (!ok) {
        fprintf(stderr, "fuzz_manifest: %s\n", what);
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    CkptManifest man, again;
    char err[2048];
    /* the text as a checksum line (what a rank's .xxh64 file holds, without its newline) */
    char *line = (char *)malloc(size + 1);
    memcpy(line, data, size);
    line[size] = '\0';
    FileSum sum;
    if (ckpt_parse_sum_line_(line, &sum) == 0)
        fuzz_assert(ckpt_plain_name_(sum.name) && sum.size >= 0, "a checksum line with a bad name or size");
    free(line);
    if (ckpt_manifest_parse_try("d/COMPLETE", (const char *)data, size, &man, err, sizeof(err)) != 0) {
        fuzz_assert(strstr(err, "'d/COMPLETE'") != NULL, "an error that does not name the file");
        return 0;
    }
    if (!man.has_sums) {
        fuzz_assert(man.n == 0, "a marker without checksums that lists files");
        checkpoint_manifest_free(&man);
        return 0;
    }
    for (int i = 0; i < man.n; i++) {
        fuzz_assert(ckpt_plain_name_(man.files[i].name), "a file name that is not plain");
        fuzz_assert(ckpt_manifest_find(&man, man.files[i].name) == i, "a file listed twice");
    }
    size_t len;
    char *text = ckpt_manifest_text(&man, &len);
    fuzz_assert(ckpt_manifest_parse_try("d/COMPLETE", text, len, &again, err, sizeof(err)) == 0,
                "a manifest written back does not read");
    fuzz_assert(again.has_sums && again.step == man.step && again.run_id == man.run_id && again.n == man.n,
                "the round trip changed the step, run or count");
    for (int i = 0; i < man.n; i++) {
        int at = ckpt_manifest_find(&again, man.files[i].name);
        fuzz_assert(at >= 0 && again.files[at].size == man.files[i].size && again.files[at].xxh64 == man.files[i].xxh64,
                    "the round trip changed a file's checksum");
    }
    free(text);
    checkpoint_manifest_free(&again);
    checkpoint_manifest_free(&man);
    return 0;
}
