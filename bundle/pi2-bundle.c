/* pi2-bundle: converted model -> signed model.pi2 container. The container
 * writer is not part of this build yet; the tool says so instead of
 * pretending. */
#include <stdio.h>
#include <string.h>

static void usage(FILE *f)
{
    fprintf(f,
            "usage: pi2-bundle [-h|--help]\n"
            "\n"
            "Lays a converted model out as hot/cold neuron bundles in one signed model.pi2\n"
            "container. Not available in this build yet: use `pi2-run --reference HF_DIR`\n"
            "to run a Hugging Face model directory directly.\n"
            "\n"
            "  -h, --help  this help\n"
            "\n"
            "example:\n"
            "  pi2-bundle --help\n");
}

int main(int argc, char **argv)
{
    if (argc == 2 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0)) {
        usage(stdout);
        return 0;
    }
    usage(stderr);
    fprintf(stderr, "pi2-bundle: bundling is not available in this build yet\n");
    return 2;
}
