/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The integer types the BPF programs and libbpf's headers use, declared by
 * hand (see kernel.h for why), shared by every program.
 */
#ifndef READAHEADD_TYPES_H
#define READAHEADD_TYPES_H

typedef unsigned char __u8;
typedef unsigned short __u16;
typedef unsigned int __u32;
typedef unsigned long long __u64;
typedef signed int __s32;
typedef signed long long __s64;
typedef __u8 u8;
typedef __u16 u16;
typedef __u32 u32;
typedef __u64 u64;
typedef __s64 s64;
typedef __u32 __be32;
typedef __u64 __be64;
typedef __u16 __be16;
typedef __u32 __wsum;
typedef _Bool bool;

#endif /* READAHEADD_TYPES_H */
