/* A C function with ncclCommInitRank's signature, to hold the Go binding's
   by-value ncclUniqueId to the System V ABI: it checksums the 128 bytes it
   receives and reports nranks and rank through the out-pointer. Built by
   nccl_test.go with the host's C compiler; not a stand-in for NCCL. */
typedef struct { char internal[128]; } ncclUniqueId;

int check_init_rank(void **comm, int nranks, ncclUniqueId id, int rank) {
	unsigned sum = 0;
	for (int i = 0; i < 128; i++) sum = sum * 31u + (unsigned char)id.internal[i];
	*comm = (void *)(unsigned long)((unsigned long)nranks << 32 | (unsigned)rank);
	return (int)(sum & 0x7fffffff);
}
