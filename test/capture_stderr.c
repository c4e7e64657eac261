#include "capture_stderr.h"

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

char *capture_stderr(void (*fn)(void *), void *arg)
{
    fflush(stderr);
    FILE *file = tmpfile();
    if (file == NULL)
        return NULL;
    int saved = dup(2);
    dup2(fileno(file), 2);
    fn(arg);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    long size = ftell(file);
    char *text = calloc(1, (size_t)(size > 0 ? size : 0) + 1);
    rewind(file);
    if (text != NULL && size > 0)
        text[fread(text, 1, (size_t)size, file)] = '\0';
    fclose(file);
    return text;
}
