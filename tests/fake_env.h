/*
 * fake_env.h: an environment for the tests of readers that take an EnvLookup
 * (llmc/parallel/launch.h): fake_env points at NULL-terminated name, value pairs, and
 * fake_env_lookup reads them instead of the process's environment.
 */
#ifndef TESTS_FAKE_ENV_H
#define TESTS_FAKE_ENV_H

#include <string.h>

static const char **fake_env;

static const char *fake_env_lookup(const char *name)
{
    for (int i = 0; fake_env[i]; i += 2)
        if (strcmp(fake_env[i], name) == 0)
            return fake_env[i + 1];
    return NULL;
}

#endif /* TESTS_FAKE_ENV_H */
