/* Vulkan through a function table filled from the loader at run time (no link to
 * libvulkan): see vk.h. */
#define VK_NO_PROTOTYPES
#include <vulkan/vulkan.h>

#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vk.h"

static void fail(char *err, const char *fmt, ...) {
	if (!err)
		return;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(err, VXK_ERR, fmt, ap);
	va_end(ap);
}

static const char *vkres(VkResult r) {
	switch (r) {
	case VK_SUCCESS: return "success";
	case VK_ERROR_OUT_OF_HOST_MEMORY: return "out of host memory";
	case VK_ERROR_OUT_OF_DEVICE_MEMORY: return "out of device memory";
	case VK_ERROR_INITIALIZATION_FAILED: return "initialization failed";
	case VK_ERROR_DEVICE_LOST: return "device lost";
	case VK_ERROR_MEMORY_MAP_FAILED: return "memory map failed";
	case VK_ERROR_LAYER_NOT_PRESENT: return "layer not present";
	case VK_ERROR_EXTENSION_NOT_PRESENT: return "extension not present";
	case VK_ERROR_FEATURE_NOT_PRESENT: return "feature not present";
	case VK_ERROR_INCOMPATIBLE_DRIVER: return "incompatible driver";
	case VK_ERROR_TOO_MANY_OBJECTS: return "too many objects";
	case VK_ERROR_INVALID_SHADER_NV: return "invalid shader";
	case VK_TIMEOUT: return "timeout";
	default: return "error";
	}
}

/* ---- the function table ---- */

#define VXK_INSTANCE_FNS(X)                                                                                            \
	X(vkDestroyInstance)                                                                                           \
	X(vkEnumeratePhysicalDevices)                                                                                  \
	X(vkGetPhysicalDeviceProperties)                                                                               \
	X(vkGetPhysicalDeviceProperties2)                                                                              \
	X(vkGetPhysicalDeviceFeatures2)                                                                                \
	X(vkGetPhysicalDeviceMemoryProperties)                                                                         \
	X(vkGetPhysicalDeviceQueueFamilyProperties)                                                                    \
	X(vkCreateDevice)                                                                                              \
	X(vkGetDeviceProcAddr)

#define VXK_DEVICE_FNS(X)                                                                                              \
	X(vkDestroyDevice)                                                                                             \
	X(vkGetDeviceQueue)                                                                                            \
	X(vkCreateBuffer)                                                                                              \
	X(vkDestroyBuffer)                                                                                             \
	X(vkGetBufferMemoryRequirements)                                                                               \
	X(vkAllocateMemory)                                                                                            \
	X(vkFreeMemory)                                                                                                \
	X(vkBindBufferMemory)                                                                                          \
	X(vkMapMemory)                                                                                                 \
	X(vkUnmapMemory)                                                                                               \
	X(vkCreateShaderModule)                                                                                        \
	X(vkDestroyShaderModule)                                                                                       \
	X(vkCreateDescriptorSetLayout)                                                                                 \
	X(vkDestroyDescriptorSetLayout)                                                                                \
	X(vkCreatePipelineLayout)                                                                                      \
	X(vkDestroyPipelineLayout)                                                                                     \
	X(vkCreateComputePipelines)                                                                                    \
	X(vkDestroyPipeline)                                                                                           \
	X(vkCreateDescriptorPool)                                                                                      \
	X(vkDestroyDescriptorPool)                                                                                     \
	X(vkAllocateDescriptorSets)                                                                                    \
	X(vkUpdateDescriptorSets)                                                                                      \
	X(vkCreateCommandPool)                                                                                         \
	X(vkDestroyCommandPool)                                                                                        \
	X(vkAllocateCommandBuffers)                                                                                    \
	X(vkBeginCommandBuffer)                                                                                        \
	X(vkEndCommandBuffer)                                                                                          \
	X(vkResetCommandBuffer)                                                                                        \
	X(vkCmdBindPipeline)                                                                                           \
	X(vkCmdBindDescriptorSets)                                                                                     \
	X(vkCmdPushConstants)                                                                                          \
	X(vkCmdDispatch)                                                                                               \
	X(vkCmdCopyBuffer)                                                                                             \
	X(vkCmdFillBuffer)                                                                                             \
	X(vkCmdPipelineBarrier)                                                                                        \
	X(vkFreeCommandBuffers)                                                                                        \
	X(vkQueueSubmit)                                                                                               \
	X(vkCreateFence)                                                                                               \
	X(vkDestroyFence)                                                                                              \
	X(vkWaitForFences)                                                                                             \
	X(vkResetFences)                                                                                               \
	X(vkCreateQueryPool)                                                                                           \
	X(vkDestroyQueryPool)                                                                                          \
	X(vkCmdResetQueryPool)                                                                                         \
	X(vkCmdWriteTimestamp)                                                                                         \
	X(vkGetQueryPoolResults)                                                                                       \
	X(vkDeviceWaitIdle)

#define DECLARE(f) static PFN_##f f;
static PFN_vkGetInstanceProcAddr vkGetInstanceProcAddr;
static PFN_vkCreateInstance vkCreateInstance;
VXK_INSTANCE_FNS(DECLARE)
#undef DECLARE

/* Device functions are per device (a table in vxk_dev). */
typedef struct {
#define FIELD(f) PFN_##f f;
	VXK_DEVICE_FNS(FIELD)
#undef FIELD
} vxk_fns;

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static char load_err[VXK_ERR];
static VkInstance instance;
static VkPhysicalDevice *physical;
static uint32_t n_physical;

static void load(void) {
	void *lib = dlopen("libvulkan.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!lib) {
		fail(load_err, "no Vulkan loader (libvulkan.so.1): %s", dlerror());
		return;
	}
	vkGetInstanceProcAddr = (PFN_vkGetInstanceProcAddr)dlsym(lib, "vkGetInstanceProcAddr");
	if (!vkGetInstanceProcAddr) {
		fail(load_err, "the Vulkan loader has no vkGetInstanceProcAddr");
		return;
	}
	vkCreateInstance = (PFN_vkCreateInstance)vkGetInstanceProcAddr(NULL, "vkCreateInstance");
	PFN_vkEnumerateInstanceVersion version =
	    (PFN_vkEnumerateInstanceVersion)vkGetInstanceProcAddr(NULL, "vkEnumerateInstanceVersion");
	uint32_t api = VK_API_VERSION_1_0;
	if (version)
		version(&api);
	if (api < VK_API_VERSION_1_1) {
		fail(load_err, "the Vulkan loader offers version %u.%u; 1.1 is needed", VK_VERSION_MAJOR(api), VK_VERSION_MINOR(api));
		return;
	}
	VkApplicationInfo app = {.sType = VK_STRUCTURE_TYPE_APPLICATION_INFO,
	                         .pApplicationName = "voxpipe",
	                         .pEngineName = "voxpipe",
	                         .apiVersion = api >= VK_API_VERSION_1_3 ? VK_API_VERSION_1_3 : api};
	VkInstanceCreateInfo ici = {.sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO, .pApplicationInfo = &app};
	VkResult r = vkCreateInstance(&ici, NULL, &instance);
	if (r != VK_SUCCESS) {
		fail(load_err, "vkCreateInstance: %s (%d)", vkres(r), r);
		return;
	}
#define LOAD(f) f = (PFN_##f)vkGetInstanceProcAddr(instance, #f);
	VXK_INSTANCE_FNS(LOAD)
#undef LOAD
	if (!vkEnumeratePhysicalDevices || !vkGetPhysicalDeviceProperties2 || !vkCreateDevice || !vkGetDeviceProcAddr) {
		fail(load_err, "the Vulkan instance lacks core 1.1 functions");
		return;
	}
	r = vkEnumeratePhysicalDevices(instance, &n_physical, NULL);
	if (r != VK_SUCCESS) {
		fail(load_err, "vkEnumeratePhysicalDevices: %s (%d)", vkres(r), r);
		return;
	}
	physical = calloc(n_physical ? n_physical : 1, sizeof *physical);
	if (n_physical && vkEnumeratePhysicalDevices(instance, &n_physical, physical) != VK_SUCCESS)
		n_physical = 0;
}

int vxk_load(char *err) {
	pthread_once(&load_once, load);
	if (load_err[0]) {
		fail(err, "%s", load_err);
		return -1;
	}
	return 0;
}

int vxk_count(void) { return vxk_load(NULL) ? 0 : (int)n_physical; }

int vxk_info(int i, vxk_devinfo *out) {
	if (i < 0 || i >= vxk_count())
		return -1;
	memset(out, 0, sizeof *out);
	VkPhysicalDeviceSubgroupProperties sub = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES};
	VkPhysicalDeviceProperties2 p2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, .pNext = &sub};
	vkGetPhysicalDeviceProperties2(physical[i], &p2);
	snprintf(out->name, sizeof out->name, "%s", p2.properties.deviceName);
	out->type = (int)p2.properties.deviceType;
	out->vendor = p2.properties.vendorID;
	out->device = p2.properties.deviceID;
	out->api = p2.properties.apiVersion;
	out->subgroup = sub.subgroupSize;
	out->subgroup_arith = (sub.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT) &&
	                      (sub.supportedOperations & VK_SUBGROUP_FEATURE_ARITHMETIC_BIT) &&
	                      (sub.supportedOperations & VK_SUBGROUP_FEATURE_BASIC_BIT);
	out->max_buffer = p2.properties.limits.maxStorageBufferRange;
	VkPhysicalDeviceShaderFloat16Int8Features f16 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_FLOAT16_INT8_FEATURES};
	VkPhysicalDeviceShaderIntegerDotProductFeatures dot = {
	    .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_INTEGER_DOT_PRODUCT_FEATURES};
	if (out->api >= VK_API_VERSION_1_3)
		f16.pNext = &dot;
	VkPhysicalDeviceFeatures2 f2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, .pNext = &f16};
	if (vkGetPhysicalDeviceFeatures2)
		vkGetPhysicalDeviceFeatures2(physical[i], &f2);
	out->fp16 = out->api >= VK_API_VERSION_1_2 && f16.shaderFloat16; /* core (and enabled by vxk_open) from 1.2 */
	out->int8 = f16.shaderInt8;
	out->int8_dot = dot.shaderIntegerDotProduct;
	VkPhysicalDeviceMemoryProperties mp;
	vkGetPhysicalDeviceMemoryProperties(physical[i], &mp);
	for (uint32_t h = 0; h < mp.memoryHeapCount; h++)
		if ((mp.memoryHeaps[h].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT) && mp.memoryHeaps[h].size > out->device_local)
			out->device_local = mp.memoryHeaps[h].size;
	return 0;
}

/* ---- devices ---- */

struct vxk_dev {
	vxk_fns f;
	VkPhysicalDevice phys;
	VkPhysicalDeviceMemoryProperties mem;
	VkDevice dev;
	VkQueue queue;
	VkCommandPool pool;
	VkCommandBuffer cmd;
	VkFence fence;
	pthread_mutex_t mu; /* one submission at a time */
	double ns_per_tick; /* timestamp period; 0: the queue has no timestamps */
	uint64_t tick_mask; /* the timestamps' valid bits */
	/* Set (under mu) once a submission reports the device lost or never finishes: every later
	 * submission fails at once with the first failure's words instead of waiting on a
	 * device that will not answer. */
	int lost;
	char lost_why[160];
	VkResult inject; /* tests: the next submission's result, without submitting (0: none) */
};

/* How long a submission may run before the device counts as hung (lost). A program run is
 * milliseconds on a GPU; lavapipe's slowest golden stage is seconds. */
#define SUBMIT_TIMEOUT_NS (120ull * 1000 * 1000 * 1000)

vxk_dev *vxk_open(int i, char *err) {
	if (vxk_load(err))
		return NULL;
	if (i < 0 || i >= (int)n_physical) {
		fail(err, "no Vulkan device %d (there are %u)", i, n_physical);
		return NULL;
	}
	uint32_t nq = 0;
	vkGetPhysicalDeviceQueueFamilyProperties(physical[i], &nq, NULL);
	VkQueueFamilyProperties qf[32];
	if (nq > 32)
		nq = 32;
	vkGetPhysicalDeviceQueueFamilyProperties(physical[i], &nq, qf);
	int family = -1;
	for (uint32_t q = 0; q < nq && family < 0; q++)
		if (qf[q].queueFlags & VK_QUEUE_COMPUTE_BIT)
			family = (int)q;
	if (family < 0) {
		fail(err, "Vulkan device %d has no compute queue", i);
		return NULL;
	}
	vxk_dev *d = calloc(1, sizeof *d);
	if (!d) {
		fail(err, "out of memory");
		return NULL;
	}
	d->phys = physical[i];
	vkGetPhysicalDeviceMemoryProperties(d->phys, &d->mem);
	VkPhysicalDeviceProperties props;
	vkGetPhysicalDeviceProperties(d->phys, &props);
	uint32_t bits = qf[family].timestampValidBits;
	if (bits > 0 && props.limits.timestampPeriod > 0) {
		d->ns_per_tick = props.limits.timestampPeriod;
		d->tick_mask = bits >= 64 ? ~(uint64_t)0 : (((uint64_t)1 << bits) - 1);
	}
	float prio = 1.0f;
	VkDeviceQueueCreateInfo qci = {.sType = VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO,
	                               .queueFamilyIndex = (uint32_t)family,
	                               .queueCount = 1,
	                               .pQueuePriorities = &prio};
	VkDeviceCreateInfo dci = {.sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO, .queueCreateInfoCount = 1, .pQueueCreateInfos = &qci};
	/* Integer dot products (core in 1.3) where the device has them: linearq_dot's int8 sums;
	 * shaderFloat16 (core in 1.2): linearq_tiled_f16's binary16 tiles. */
	vxk_devinfo info;
	VkPhysicalDeviceShaderIntegerDotProductFeatures dot = {
	    .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_INTEGER_DOT_PRODUCT_FEATURES, .shaderIntegerDotProduct = VK_TRUE};
	VkPhysicalDeviceShaderFloat16Int8Features f16 = {
	    .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_FLOAT16_INT8_FEATURES, .shaderFloat16 = VK_TRUE};
	if (vxk_info(i, &info) == 0) { /* which reports each only from the version that has it */
		if (info.int8_dot) {
			dot.pNext = (void *)dci.pNext;
			dci.pNext = &dot;
		}
		if (info.fp16) {
			f16.pNext = (void *)dci.pNext;
			dci.pNext = &f16;
		}
	}
	VkResult r = vkCreateDevice(d->phys, &dci, NULL, &d->dev);
	if (r != VK_SUCCESS) {
		fail(err, "vkCreateDevice: %s (%d)", vkres(r), r);
		free(d);
		return NULL;
	}
#define LOADD(fn) d->f.fn = (PFN_##fn)vkGetDeviceProcAddr(d->dev, #fn);
	VXK_DEVICE_FNS(LOADD)
#undef LOADD
	d->f.vkGetDeviceQueue(d->dev, (uint32_t)family, 0, &d->queue);
	VkCommandPoolCreateInfo pci = {.sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO,
	                               .flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT,
	                               .queueFamilyIndex = (uint32_t)family};
	VkCommandBufferAllocateInfo cai = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO,
	                                   .level = VK_COMMAND_BUFFER_LEVEL_PRIMARY,
	                                   .commandBufferCount = 1};
	VkFenceCreateInfo fci = {.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
	if ((r = d->f.vkCreateCommandPool(d->dev, &pci, NULL, &d->pool)) != VK_SUCCESS ||
	    (cai.commandPool = d->pool, r = d->f.vkAllocateCommandBuffers(d->dev, &cai, &d->cmd)) != VK_SUCCESS ||
	    (r = d->f.vkCreateFence(d->dev, &fci, NULL, &d->fence)) != VK_SUCCESS) {
		fail(err, "Vulkan device %d: command setup: %s (%d)", i, vkres(r), r);
		vxk_close(d);
		return NULL;
	}
	pthread_mutex_init(&d->mu, NULL);
	return d;
}

void vxk_close(vxk_dev *d) {
	if (!d)
		return;
	if (d->dev) {
		if (!d->lost) /* a hung device might never go idle */
			d->f.vkDeviceWaitIdle(d->dev);
		if (d->fence)
			d->f.vkDestroyFence(d->dev, d->fence, NULL);
		if (d->pool)
			d->f.vkDestroyCommandPool(d->dev, d->pool, NULL);
		d->f.vkDestroyDevice(d->dev, NULL);
	}
	free(d);
}

/* ---- buffers ---- */

static int memory_type(vxk_dev *d, uint32_t bits, VkMemoryPropertyFlags want) {
	for (uint32_t t = 0; t < d->mem.memoryTypeCount; t++)
		if ((bits & (1u << t)) && (d->mem.memoryTypes[t].propertyFlags & want) == want)
			return (int)t;
	return -1;
}

static int fill_zero(vxk_dev *d, VkBuffer buf, char *err);

int vxk_alloc(vxk_dev *d, uint64_t size, int host, vxk_buf *out, char *err) {
	memset(out, 0, sizeof *out);
	if (size == 0)
		size = 4;
	VkBufferCreateInfo bci = {.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO,
	                          .size = size,
	                          .usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT |
	                                   VK_BUFFER_USAGE_TRANSFER_DST_BIT,
	                          .sharingMode = VK_SHARING_MODE_EXCLUSIVE};
	VkBuffer buf;
	VkResult r = d->f.vkCreateBuffer(d->dev, &bci, NULL, &buf);
	if (r != VK_SUCCESS) {
		fail(err, "vkCreateBuffer of %llu bytes: %s (%d)", (unsigned long long)size, vkres(r), r);
		return -1;
	}
	VkMemoryRequirements req;
	d->f.vkGetBufferMemoryRequirements(d->dev, buf, &req);
	int t = host ? memory_type(d, req.memoryTypeBits, VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT)
	             : memory_type(d, req.memoryTypeBits, VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT);
	if (t < 0 && !host)
		t = memory_type(d, req.memoryTypeBits, 0);
	if (t < 0) {
		d->f.vkDestroyBuffer(d->dev, buf, NULL);
		fail(err, "no %s memory type for a buffer", host ? "host-visible" : "device");
		return -1;
	}
	VkMemoryAllocateInfo mai = {.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO, .allocationSize = req.size, .memoryTypeIndex = (uint32_t)t};
	VkDeviceMemory mem;
	if ((r = d->f.vkAllocateMemory(d->dev, &mai, NULL, &mem)) != VK_SUCCESS) {
		d->f.vkDestroyBuffer(d->dev, buf, NULL);
		fail(err, "vkAllocateMemory of %llu bytes: %s (%d)", (unsigned long long)req.size, vkres(r), r);
		return -1;
	}
	void *map = NULL;
	if ((r = d->f.vkBindBufferMemory(d->dev, buf, mem, 0)) != VK_SUCCESS ||
	    (host && (r = d->f.vkMapMemory(d->dev, mem, 0, VK_WHOLE_SIZE, 0, &map)) != VK_SUCCESS)) {
		d->f.vkDestroyBuffer(d->dev, buf, NULL);
		d->f.vkFreeMemory(d->dev, mem, NULL);
		fail(err, "binding or mapping a buffer: %s (%d)", vkres(r), r);
		return -1;
	}
	/* New buffers read as zeros, as the CPU backend's do: a cache's unwritten rows (masked out,
	 * yet multiplied by a zero weight) must not hold a freed buffer's NaNs. */
	if (host) {
		memset(map, 0, size);
	} else if (fill_zero(d, buf, err)) {
		d->f.vkDestroyBuffer(d->dev, buf, NULL);
		d->f.vkFreeMemory(d->dev, mem, NULL);
		return -1;
	}
	out->buf = (uint64_t)(uintptr_t)buf;
	out->mem = (uint64_t)(uintptr_t)mem;
	out->map = map;
	out->size = size;
	return 0;
}

void vxk_free(vxk_dev *d, vxk_buf *b) {
	if (!b || !b->buf)
		return;
	if (b->map)
		d->f.vkUnmapMemory(d->dev, (VkDeviceMemory)(uintptr_t)b->mem);
	d->f.vkDestroyBuffer(d->dev, (VkBuffer)(uintptr_t)b->buf, NULL);
	d->f.vkFreeMemory(d->dev, (VkDeviceMemory)(uintptr_t)b->mem, NULL);
	memset(b, 0, sizeof *b);
}

/* submit_wait submits an ended command buffer and waits for it; d->mu is held. A lost or
 * hung device is remembered: its fence may never signal, so it is not reused. */
static int submit_wait(vxk_dev *d, VkCommandBuffer cmd, char *err) {
	if (d->lost) {
		fail(err, "the device was lost earlier (%s); reopen the model to use it again", d->lost_why);
		return -1;
	}
	VkResult r = d->inject;
	if (r != VK_SUCCESS) {
		d->inject = VK_SUCCESS;
	} else {
		VkSubmitInfo si = {.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO, .commandBufferCount = 1, .pCommandBuffers = &cmd};
		r = d->f.vkQueueSubmit(d->queue, 1, &si, d->fence);
		if (r == VK_SUCCESS)
			r = d->f.vkWaitForFences(d->dev, 1, &d->fence, VK_TRUE, SUBMIT_TIMEOUT_NS);
		if (r == VK_SUCCESS)
			d->f.vkResetFences(d->dev, 1, &d->fence);
	}
	if (r == VK_SUCCESS)
		return 0;
	if (r == VK_ERROR_DEVICE_LOST || r == VK_TIMEOUT) {
		d->lost = 1;
		snprintf(d->lost_why, sizeof d->lost_why, "%s",
		         r == VK_TIMEOUT ? "a submission did not finish in 120 s" : "the driver reported the device lost");
	}
	fail(err, "queue submission: %s (%d)", vkres(r), r);
	return -1;
}

void vxk_inject(vxk_dev *d, int result) {
	pthread_mutex_lock(&d->mu);
	d->inject = (VkResult)result;
	pthread_mutex_unlock(&d->mu);
}

int vxk_lost(vxk_dev *d) {
	pthread_mutex_lock(&d->mu);
	int lost = d->lost;
	pthread_mutex_unlock(&d->mu);
	return lost;
}

/* submit ends the device's command buffer (what begin started) and runs it; d->mu is held. */
static int submit(vxk_dev *d, char *err) {
	VkResult r = d->f.vkEndCommandBuffer(d->cmd);
	if (r != VK_SUCCESS) {
		fail(err, "vkEndCommandBuffer: %s (%d)", vkres(r), r);
		return -1;
	}
	return submit_wait(d, d->cmd, err);
}

static int begin(vxk_dev *d, char *err) {
	d->f.vkResetCommandBuffer(d->cmd, 0);
	VkCommandBufferBeginInfo bi = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO,
	                               .flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT};
	VkResult r = d->f.vkBeginCommandBuffer(d->cmd, &bi);
	if (r != VK_SUCCESS) {
		fail(err, "vkBeginCommandBuffer: %s (%d)", vkres(r), r);
		return -1;
	}
	return 0;
}

static int fill_zero(vxk_dev *d, VkBuffer buf, char *err) {
	pthread_mutex_lock(&d->mu);
	int rc = begin(d, err);
	if (rc == 0) {
		d->f.vkCmdFillBuffer(d->cmd, buf, 0, VK_WHOLE_SIZE, 0);
		rc = submit(d, err);
	}
	pthread_mutex_unlock(&d->mu);
	return rc;
}

int vxk_copy(vxk_dev *d, vxk_buf *src, uint64_t src_off, vxk_buf *dst, uint64_t dst_off, uint64_t size, char *err) {
	if (src_off + size > src->size || dst_off + size > dst->size || src_off + size < size || dst_off + size < size) {
		fail(err, "copy of %llu bytes (from %llu to %llu) between buffers of %llu and %llu", (unsigned long long)size,
		     (unsigned long long)src_off, (unsigned long long)dst_off, (unsigned long long)src->size,
		     (unsigned long long)dst->size);
		return -1;
	}
	if (size == 0)
		return 0;
	pthread_mutex_lock(&d->mu);
	int rc = begin(d, err);
	if (rc == 0) {
		VkBufferCopy c = {.srcOffset = src_off, .dstOffset = dst_off, .size = size};
		d->f.vkCmdCopyBuffer(d->cmd, (VkBuffer)(uintptr_t)src->buf, (VkBuffer)(uintptr_t)dst->buf, 1, &c);
		rc = submit(d, err);
	}
	pthread_mutex_unlock(&d->mu);
	return rc;
}

/* ---- pipelines ---- */

struct vxk_pipe {
	int nbuf, push;
	VkShaderModule mod;
	VkDescriptorSetLayout dsl;
	VkPipelineLayout layout;
	VkPipeline pipe;
};

vxk_pipe *vxk_pipeline(vxk_dev *d, const uint32_t *spirv, size_t bytes, int nbuf, int push_bytes, char *err) {
	if (nbuf < 1 || nbuf > 16 || push_bytes < 0 || push_bytes > 128 || push_bytes % 4 || bytes % 4 || bytes < 20 ||
	    spirv[0] != 0x07230203u) {
		fail(err, "bad pipeline request: %d buffers, %d push bytes, %zu SPIR-V bytes", nbuf, push_bytes, bytes);
		return NULL;
	}
	vxk_pipe *p = calloc(1, sizeof *p);
	if (!p) {
		fail(err, "out of memory");
		return NULL;
	}
	p->nbuf = nbuf;
	p->push = push_bytes;
	VkResult r;
	VkShaderModuleCreateInfo smi = {.sType = VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO, .codeSize = bytes, .pCode = spirv};
	VkDescriptorSetLayoutBinding b[16];
	for (int i = 0; i < nbuf; i++)
		b[i] = (VkDescriptorSetLayoutBinding){.binding = (uint32_t)i,
		                                      .descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
		                                      .descriptorCount = 1,
		                                      .stageFlags = VK_SHADER_STAGE_COMPUTE_BIT};
	VkDescriptorSetLayoutCreateInfo dli = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO,
	                                       .bindingCount = (uint32_t)nbuf,
	                                       .pBindings = b};
	VkPushConstantRange pr = {.stageFlags = VK_SHADER_STAGE_COMPUTE_BIT, .size = (uint32_t)push_bytes};
	VkPipelineLayoutCreateInfo pli = {.sType = VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO,
	                                  .setLayoutCount = 1,
	                                  .pushConstantRangeCount = push_bytes ? 1 : 0,
	                                  .pPushConstantRanges = &pr};
	const char *step = "vkCreateShaderModule";
	if ((r = d->f.vkCreateShaderModule(d->dev, &smi, NULL, &p->mod)) != VK_SUCCESS)
		goto bad;
	step = "vkCreateDescriptorSetLayout";
	if ((r = d->f.vkCreateDescriptorSetLayout(d->dev, &dli, NULL, &p->dsl)) != VK_SUCCESS)
		goto bad;
	pli.pSetLayouts = &p->dsl;
	step = "vkCreatePipelineLayout";
	if ((r = d->f.vkCreatePipelineLayout(d->dev, &pli, NULL, &p->layout)) != VK_SUCCESS)
		goto bad;
	VkComputePipelineCreateInfo cpi = {
	    .sType = VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO,
	    .stage = {.sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO, .stage = VK_SHADER_STAGE_COMPUTE_BIT, .module = p->mod, .pName = "main"},
	    .layout = p->layout};
	step = "vkCreateComputePipelines";
	if ((r = d->f.vkCreateComputePipelines(d->dev, VK_NULL_HANDLE, 1, &cpi, NULL, &p->pipe)) != VK_SUCCESS)
		goto bad;
	return p;
bad:
	fail(err, "%s: %s (%d)", step, vkres(r), r);
	vxk_pipeline_free(d, p);
	return NULL;
}

void vxk_pipeline_free(vxk_dev *d, vxk_pipe *p) {
	if (!p)
		return;
	if (p->pipe)
		d->f.vkDestroyPipeline(d->dev, p->pipe, NULL);
	if (p->layout)
		d->f.vkDestroyPipelineLayout(d->dev, p->layout, NULL);
	if (p->dsl)
		d->f.vkDestroyDescriptorSetLayout(d->dev, p->dsl, NULL);
	if (p->mod)
		d->f.vkDestroyShaderModule(d->dev, p->mod, NULL);
	free(p);
}

/* ---- programs ---- */

struct vxk_prog {
	vxk_dev *d;
	VkCommandBuffer cmd;
	VkDescriptorPool pool;
	VkQueryPool queries; /* timed programs: a timestamp before the first and after each dispatch */
	int n, max;
	int ended;
};

int vxk_timestamps(vxk_dev *d) { return d->ns_per_tick > 0; }

vxk_prog *vxk_prog_new(vxk_dev *d, int max_dispatches, int timed, char *err) {
	if (max_dispatches < 1)
		max_dispatches = 1;
	vxk_prog *pr = calloc(1, sizeof *pr);
	if (!pr) {
		fail(err, "out of memory");
		return NULL;
	}
	pr->d = d;
	pr->max = max_dispatches;
	VkDescriptorPoolSize ps = {.type = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, .descriptorCount = (uint32_t)(16 * max_dispatches)};
	VkDescriptorPoolCreateInfo dpi = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO,
	                                  .maxSets = (uint32_t)max_dispatches,
	                                  .poolSizeCount = 1,
	                                  .pPoolSizes = &ps};
	VkCommandBufferAllocateInfo cai = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO,
	                                   .commandPool = d->pool,
	                                   .level = VK_COMMAND_BUFFER_LEVEL_PRIMARY,
	                                   .commandBufferCount = 1};
	VkCommandBufferBeginInfo bi = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
	VkResult r;
	pthread_mutex_lock(&d->mu); /* the command pool is the device's */
	r = d->f.vkAllocateCommandBuffers(d->dev, &cai, &pr->cmd);
	pthread_mutex_unlock(&d->mu);
	if (r != VK_SUCCESS || (r = d->f.vkCreateDescriptorPool(d->dev, &dpi, NULL, &pr->pool)) != VK_SUCCESS ||
	    (r = d->f.vkBeginCommandBuffer(pr->cmd, &bi)) != VK_SUCCESS) {
		fail(err, "program setup: %s (%d)", vkres(r), r);
		vxk_prog_free(pr);
		return NULL;
	}
	if (timed && d->ns_per_tick > 0) {
		VkQueryPoolCreateInfo qi = {.sType = VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO,
		                            .queryType = VK_QUERY_TYPE_TIMESTAMP,
		                            .queryCount = (uint32_t)(max_dispatches + 1)};
		if ((r = d->f.vkCreateQueryPool(d->dev, &qi, NULL, &pr->queries)) != VK_SUCCESS) {
			fail(err, "timestamp queries: %s (%d)", vkres(r), r);
			vxk_prog_free(pr);
			return NULL;
		}
		d->f.vkCmdResetQueryPool(pr->cmd, pr->queries, 0, qi.queryCount);
		d->f.vkCmdWriteTimestamp(pr->cmd, VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, pr->queries, 0);
	}
	return pr;
}

int vxk_prog_times(vxk_prog *pr, double *ns, char *err) {
	if (!pr->queries) {
		fail(err, "the program was not recorded with timestamps");
		return -1;
	}
	uint64_t *t = calloc((size_t)pr->n + 1, sizeof *t);
	if (!t) {
		fail(err, "out of memory");
		return -1;
	}
	VkResult r = pr->d->f.vkGetQueryPoolResults(pr->d->dev, pr->queries, 0, (uint32_t)pr->n + 1, ((size_t)pr->n + 1) * sizeof *t, t,
	                                            sizeof *t, VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT);
	if (r != VK_SUCCESS) {
		free(t);
		fail(err, "vkGetQueryPoolResults: %s (%d)", vkres(r), r);
		return -1;
	}
	for (int i = 0; i < pr->n; i++)
		ns[i] = (double)((t[i + 1] - t[i]) & pr->d->tick_mask) * pr->d->ns_per_tick;
	free(t);
	return 0;
}

/* barrier makes every earlier shader write visible to later shader reads and writes (and,
 * at the end, to the host). */
static void barrier(vxk_prog *pr, VkPipelineStageFlags dst_stage, VkAccessFlags dst_access) {
	VkMemoryBarrier mb = {.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER,
	                      .srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT,
	                      .dstAccessMask = dst_access};
	pr->d->f.vkCmdPipelineBarrier(pr->cmd, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, dst_stage, 0, 1, &mb, 0, NULL, 0, NULL);
}

int vxk_prog_add(vxk_prog *pr, vxk_pipe *p, int barrier_before, vxk_buf *const *bufs, int nbuf, const void *push, int push_bytes,
                 uint32_t gx, uint32_t gy, uint32_t gz, char *err) {
	vxk_dev *d = pr->d;
	if (pr->ended || pr->n >= pr->max || nbuf != p->nbuf || push_bytes != p->push) {
		fail(err, "dispatch %d of at most %d with %d buffers and %d push bytes (the pipeline takes %d and %d)", pr->n, pr->max,
		     nbuf, push_bytes, p->nbuf, p->push);
		return -1;
	}
	VkDescriptorSet set;
	VkDescriptorSetAllocateInfo dai = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO,
	                                   .descriptorPool = pr->pool,
	                                   .descriptorSetCount = 1,
	                                   .pSetLayouts = &p->dsl};
	VkResult r = d->f.vkAllocateDescriptorSets(d->dev, &dai, &set);
	if (r != VK_SUCCESS) {
		fail(err, "vkAllocateDescriptorSets: %s (%d)", vkres(r), r);
		return -1;
	}
	VkDescriptorBufferInfo bi[16];
	VkWriteDescriptorSet w[16];
	for (int i = 0; i < nbuf; i++) {
		bi[i] = (VkDescriptorBufferInfo){.buffer = (VkBuffer)(uintptr_t)bufs[i]->buf, .range = VK_WHOLE_SIZE};
		w[i] = (VkWriteDescriptorSet){.sType = VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET,
		                              .dstSet = set,
		                              .dstBinding = (uint32_t)i,
		                              .descriptorCount = 1,
		                              .descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
		                              .pBufferInfo = &bi[i]};
	}
	d->f.vkUpdateDescriptorSets(d->dev, (uint32_t)nbuf, w, 0, NULL);
	if (pr->n > 0 && barrier_before)
		barrier(pr, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT);
	d->f.vkCmdBindPipeline(pr->cmd, VK_PIPELINE_BIND_POINT_COMPUTE, p->pipe);
	d->f.vkCmdBindDescriptorSets(pr->cmd, VK_PIPELINE_BIND_POINT_COMPUTE, p->layout, 0, 1, &set, 0, NULL);
	if (push_bytes)
		d->f.vkCmdPushConstants(pr->cmd, p->layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, (uint32_t)push_bytes, push);
	d->f.vkCmdDispatch(pr->cmd, gx, gy, gz);
	pr->n++;
	if (pr->queries) /* when every earlier command has finished its compute work */
		d->f.vkCmdWriteTimestamp(pr->cmd, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, pr->queries, (uint32_t)pr->n);
	return 0;
}

int vxk_prog_end(vxk_prog *pr, char *err) {
	if (pr->ended)
		return 0;
	barrier(pr, VK_PIPELINE_STAGE_HOST_BIT, VK_ACCESS_HOST_READ_BIT);
	VkResult r = pr->d->f.vkEndCommandBuffer(pr->cmd);
	if (r != VK_SUCCESS) {
		fail(err, "vkEndCommandBuffer: %s (%d)", vkres(r), r);
		return -1;
	}
	pr->ended = 1;
	return 0;
}

int vxk_prog_run(vxk_prog *pr, char *err) {
	vxk_dev *d = pr->d;
	if (!pr->ended) {
		fail(err, "program not ended");
		return -1;
	}
	pthread_mutex_lock(&d->mu);
	int rc = submit_wait(d, pr->cmd, err);
	pthread_mutex_unlock(&d->mu);
	return rc;
}

void vxk_prog_free(vxk_prog *pr) {
	if (!pr)
		return;
	vxk_dev *d = pr->d;
	if (pr->pool)
		d->f.vkDestroyDescriptorPool(d->dev, pr->pool, NULL);
	if (pr->queries)
		d->f.vkDestroyQueryPool(d->dev, pr->queries, NULL);
	if (pr->cmd) {
		pthread_mutex_lock(&d->mu);
		d->f.vkFreeCommandBuffers(d->dev, d->pool, 1, &pr->cmd);
		pthread_mutex_unlock(&d->mu);
	}
	free(pr);
}
