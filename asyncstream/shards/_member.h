/* What _tarwalk.c registers of _member.c (the Member type): one extension, two files. */
#ifndef ASYNCSTREAM_MEMBER_H
#define ASYNCSTREAM_MEMBER_H

#include <Python.h>

#include "_table.h"

/* Register Member on the module (0, or -1 with an exception set). */
TABLE_HIDDEN int member_module_exec(PyObject *module);

#endif
