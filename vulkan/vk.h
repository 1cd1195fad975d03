/* The Vulkan runtime of voxpipe's GPU backend: the loader is opened at run time (dlopen of
 * libvulkan.so.1), so the binary runs where no Vulkan is installed. One instance per process;
 * a vxk_dev is one logical device with one compute queue. Buffers, pipelines and the
 * buffer tables passed to vxk_prog_add live in C memory. */
#ifndef VXK_H
#define VXK_H

#include <stddef.h>
#include <stdint.h>

#define VXK_ERR 512 /* bytes of an error message buffer */

typedef struct {
	char name[256];
	int type; /* VkPhysicalDeviceType: 1 integrated, 2 discrete, 3 virtual, 4 cpu, 0 other */
	uint32_t vendor, device, api;
	uint64_t device_local; /* bytes of the largest device-local heap */
	uint32_t subgroup;     /* subgroup size (0: unknown) */
	int subgroup_arith;    /* compute shaders have subgroup arithmetic (subgroupAdd) */
	int fp16, int8;        /* shaderFloat16, shaderInt8 */
	int int8_dot;          /* shaderIntegerDotProduct (Vulkan 1.3) */
	uint64_t max_buffer;   /* maxStorageBufferRange: the most bytes a shader's buffer may hold */
} vxk_devinfo;

/* Opens the loader and creates the instance (once); 0 or -1 with a message in err. */
int vxk_load(char *err);
int vxk_count(void);
int vxk_info(int i, vxk_devinfo *out);

typedef struct vxk_dev vxk_dev;
vxk_dev *vxk_open(int i, char *err);
void vxk_close(vxk_dev *d);

typedef struct {
	uint64_t buf, mem; /* VkBuffer, VkDeviceMemory */
	void *map;         /* host-visible buffers: mapped for their lifetime */
	uint64_t size;
} vxk_buf;

/* host: host-visible and coherent (staging, inputs, outputs); else device-local. */
int vxk_alloc(vxk_dev *d, uint64_t size, int host, vxk_buf *out, char *err);
void vxk_free(vxk_dev *d, vxk_buf *b);
/* Copies size bytes from src at src_off to dst at dst_off on the queue and waits. */
int vxk_copy(vxk_dev *d, vxk_buf *src, uint64_t src_off, vxk_buf *dst, uint64_t dst_off, uint64_t size, char *err);

typedef struct vxk_pipe vxk_pipe;
/* A compute pipeline over nbuf storage buffers (bindings 0..nbuf-1) and push_bytes of push
 * constants; the shader's entry point is "main". */
vxk_pipe *vxk_pipeline(vxk_dev *d, const uint32_t *spirv, size_t bytes, int nbuf, int push_bytes, char *err);
void vxk_pipeline_free(vxk_dev *d, vxk_pipe *p);
/* A program: dispatches recorded once into one command buffer (each with its own descriptor
 * set, a barrier before those that depend on earlier ones: barrier_before) and replayed by
 * vxk_prog_run, one submission per run. */
typedef struct vxk_prog vxk_prog;
vxk_prog *vxk_prog_new(vxk_dev *d, int max_dispatches, int timed, char *err);
int vxk_prog_add(vxk_prog *pr, vxk_pipe *p, int barrier_before, vxk_buf *const *bufs, int nbuf, const void *push, int push_bytes,
                 uint32_t gx, uint32_t gy, uint32_t gz, char *err);
int vxk_prog_end(vxk_prog *pr, char *err);
int vxk_prog_run(vxk_prog *pr, char *err);
/* Whether the device's compute queue has timestamps (timed programs need them). */
int vxk_timestamps(vxk_dev *d);
/* A timed program's last run: ns[i] is the time from the end of dispatch i-1 (the start,
 * for i = 0) to the end of dispatch i. */
int vxk_prog_times(vxk_prog *pr, double *ns, char *err);
void vxk_prog_free(vxk_prog *pr);
/* Whether a submission found the device lost or hung; every later one fails at once. */
int vxk_lost(vxk_dev *d);
/* Tests: the next submission returns result (a VkResult) without running. */
void vxk_inject(vxk_dev *d, int result);

#endif
