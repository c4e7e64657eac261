/* The MR-mode stand-in (test/ofi_mr_shim.c): what it saw, for tests. */
#ifndef FERRY_TEST_OFI_MR_SHIM_H
#define FERRY_TEST_OFI_MR_SHIM_H

/* "local", "bound", "raw", "offset", "prov_key", "rma" or "violations". */
unsigned long ferry_ofi_mr_shim_count(const char *what);

#endif
