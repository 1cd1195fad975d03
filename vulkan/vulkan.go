// Package vulkan is the GPU runtime under voxpipe's Vulkan backend: it opens the Vulkan
// loader at run time (no GPU, no driver or no loader is an error, never a failed start),
// lists devices, and runs the engine's ops as compute shaders on them. The shaders are GLSL
// in shaders/, compiled to SPIR-V in spv/ by `go generate` (glslc); the SPIR-V is committed,
// so building needs no shader compiler, and `make shaders-check` verifies it is current.
//
// It holds devices, buffers, pipelines and the first ops' shaders (elementwise unary and
// binary ops, batched matmul, LayerNorm/RMSNorm, softmax, RoPE, attention, over strided
// views), run one at a time (Device.Run) or recorded into a Program that one submission
// replays; engine.Vulkan compiles graphs onto them. Every shader is tested on Mesa's
// lavapipe, against float64 references here and against the CPU backend in engine.
package vulkan

/*
#cgo CFLAGS: -std=c11 -O2 -Wall
#cgo LDFLAGS: -ldl -lpthread
#include <stdlib.h>
#include "vk.h"
*/
import "C"

import (
	"embed"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"unsafe"
)

//go:generate sh -c "for f in shaders/*.comp; do n=$DOLLAR{f#shaders/}; glslc -O --target-env=vulkan1.1 -o spv/$DOLLAR{n%.comp}.spv $DOLLAR{f} || exit 1; done"

//go:embed spv/*.spv
var spirv embed.FS

func cerr(buf *C.char) error { return errors.New(C.GoString(buf)) }

func errBuf() *C.char { return (*C.char)(C.calloc(C.VXK_ERR, 1)) }

// Available reports why Vulkan cannot be used here (nil when it can): no loader, no
// instance, or a loader older than 1.1.
func Available() error {
	e := errBuf()
	defer C.free(unsafe.Pointer(e))
	if C.vxk_load(e) != 0 {
		return cerr(e)
	}
	return nil
}

// DeviceType is the kind of a Vulkan device.
type DeviceType int

// The VkPhysicalDeviceType values.
const (
	Other DeviceType = iota
	Integrated
	Discrete
	Virtual
	CPU
)

func (t DeviceType) String() string {
	switch t {
	case Integrated:
		return "integrated GPU"
	case Discrete:
		return "discrete GPU"
	case Virtual:
		return "virtual GPU"
	case CPU:
		return "CPU (software)"
	}
	return "other"
}

// DeviceInfo describes one Vulkan device.
type DeviceInfo struct {
	Index             int
	Name              string
	Type              DeviceType
	VendorID, ID      uint32
	APIVersion        string
	DeviceLocalBytes  uint64 // the largest device-local memory heap
	SubgroupSize      int
	SubgroupArith     bool   // compute shaders have subgroup arithmetic (subgroupAdd)
	FP16, Int8, DotI8 bool   // shaderFloat16, shaderInt8, shaderIntegerDotProduct
	MaxBufferBytes    uint64 // maxStorageBufferRange: the largest buffer a shader may bind
}

// Devices lists the Vulkan devices (none, with the reason, when Vulkan is unavailable).
func Devices() ([]DeviceInfo, error) {
	if err := Available(); err != nil {
		return nil, err
	}
	var out []DeviceInfo
	for i := range int(C.vxk_count()) {
		var in C.vxk_devinfo
		if C.vxk_info(C.int(i), &in) != 0 {
			continue
		}
		api := uint32(in.api)
		out = append(out, DeviceInfo{Index: i, Name: C.GoString(&in.name[0]), Type: DeviceType(in._type),
			VendorID: uint32(in.vendor), ID: uint32(in.device),
			APIVersion:       fmt.Sprintf("%d.%d.%d", api>>22&0x7f, api>>12&0x3ff, api&0xfff),
			DeviceLocalBytes: uint64(in.device_local), SubgroupSize: int(in.subgroup), SubgroupArith: in.subgroup_arith != 0,
			FP16: in.fp16 != 0, Int8: in.int8 != 0, DotI8: in.int8_dot != 0, MaxBufferBytes: uint64(in.max_buffer)})
	}
	return out, nil
}

// Device is one opened Vulkan device with a compute queue. Its methods may be called from
// several goroutines (submissions are serialised).
type Device struct {
	Info DeviceInfo
	d    *C.vxk_dev

	mu      sync.Mutex
	pipes   map[string]*pipeline
	int8Dot bool  // Q8_0 products of a few rows in integer dot products (int8DotPolicy)
	half    bool  // Linear's tiles of many rows in binary16 (halfTilesPolicy)
	tileRow int64 // the fewest x rows that take Linear's tiles, 0 never (tileRowsPolicy)

	deviceBytes, hostBytes atomic.Int64 // live allocations (MemoryInUse)
	peakBytes              atomic.Int64 // most of both at once

	// The live buffers and programs: Close frees what is left of them, so that freeing one
	// after the device is closed (a model closed after its backend) is harmless.
	liveMu sync.Mutex
	closed bool
	bufs   map[*Buffer]struct{}
	progs  map[*Program]struct{}
}

// ErrClosed is the error of work asked of a closed device.
var ErrClosed = errors.New("vulkan: the device is closed")

// track notes a new buffer or program; false (and nothing noted) once the device is closed.
func (d *Device) track(b *Buffer, p *Program) bool {
	d.liveMu.Lock()
	defer d.liveMu.Unlock()
	if d.closed {
		return false
	}
	if b != nil {
		d.bufs[b] = struct{}{}
	}
	if p != nil {
		d.progs[p] = struct{}{}
	}
	return true
}

// untrack takes a buffer or program off the live list: false when it was not on it (freed
// already, or by the device's Close).
func (d *Device) untrack(b *Buffer, p *Program) bool {
	d.liveMu.Lock()
	defer d.liveMu.Unlock()
	if b != nil {
		if _, ok := d.bufs[b]; !ok {
			return false
		}
		delete(d.bufs, b)
	}
	if p != nil {
		if _, ok := d.progs[p]; !ok {
			return false
		}
		delete(d.progs, p)
	}
	return true
}

// isClosed reports whether Close has begun.
func (d *Device) isClosed() bool {
	d.liveMu.Lock()
	defer d.liveMu.Unlock()
	return d.closed
}

// MemoryInUse is the memory of the device's live buffers: device-local and host-visible.
func (d *Device) MemoryInUse() (device, host int64) {
	return d.deviceBytes.Load(), d.hostBytes.Load()
}

// MemoryPeak is the most memory (device-local and host-visible together) the device's
// buffers have held at once.
func (d *Device) MemoryPeak() int64 { return d.peakBytes.Load() }

func (d *Device) count(bytes int64, host bool) {
	if host {
		d.hostBytes.Add(bytes)
	} else {
		d.deviceBytes.Add(bytes)
	}
	now := d.deviceBytes.Load() + d.hostBytes.Load()
	for {
		p := d.peakBytes.Load()
		if now <= p || d.peakBytes.CompareAndSwap(p, now) {
			return
		}
	}
}

// Open opens device index (see Devices).
func Open(index int) (*Device, error) {
	devs, err := Devices()
	if err != nil {
		return nil, err
	}
	if index < 0 || index >= len(devs) {
		return nil, fmt.Errorf("vulkan: no device %d (there are %d; voxpipe devices --gpu lists them)", index, len(devs))
	}
	e := errBuf()
	defer C.free(unsafe.Pointer(e))
	d := C.vxk_open(C.int(index), e)
	if d == nil {
		return nil, fmt.Errorf("vulkan: %s: %w", devs[index].Name, cerr(e))
	}
	dev := &Device{Info: devs[index], d: d, pipes: map[string]*pipeline{}, bufs: map[*Buffer]struct{}{}, progs: map[*Program]struct{}{}}
	if dev.int8Dot, err = int8DotPolicy(dev.Info); err == nil {
		if dev.half, err = halfTilesPolicy(dev.Info); err == nil {
			dev.tileRow, err = tileRowsPolicy(dev.Info)
		}
	}
	if err != nil {
		dev.Close()
		return nil, err
	}
	return dev, nil
}

// int8DotPolicy decides whether Q8_0 products of a few rows use integer dot products on a
// device that has them (and subgroup arithmetic): on GPUs, where they are instructions; not
// on a software device (lavapipe), where they are emulated and half as fast as fp32 sums.
// VOXPIPE_VULKAN_INT8_DOT=0 or 1 overrides it, to compare the two on a GPU.
func int8DotPolicy(info DeviceInfo) (bool, error) {
	return gpuFeaturePolicy("VOXPIPE_VULKAN_INT8_DOT", info, info.DotI8 && info.SubgroupArith, "integer dot products")
}

// halfTilesPolicy decides whether Linear's products of many rows stage their tiles in
// binary16 (products and sums stay fp32) on a device with shaderFloat16: on GPUs,
// where it halves the shared memory a tile takes; not on a software device, where binary16
// is converted in software. VOXPIPE_VULKAN_F16=0 or 1 overrides it, to compare the two.
func halfTilesPolicy(info DeviceInfo) (bool, error) {
	return gpuFeaturePolicy("VOXPIPE_VULKAN_F16", info, info.FP16, "shaderFloat16")
}

// gpuFeaturePolicy is a feature's use on a device that has it (has): on unless the device is
// a software one, or as the environment variable env says: 0 never, 1 wherever the device
// has it; any other value is an error naming the choices.
func gpuFeaturePolicy(env string, info DeviceInfo, has bool, feature string) (bool, error) {
	switch v := os.Getenv(env); v {
	case "":
		return has && info.Type != CPU, nil
	case "0":
		return false, nil
	case "1":
		return has, nil
	default:
		return false, fmt.Errorf("vulkan: %s=%q: 0 (never), 1 (where the device has %s) or unset (on GPUs that have it)", env, v, feature)
	}
}

// tileRowsPolicy is the fewest x rows for which Linear computes tiles of the output
// (lqTiledRows; see lqShader), or 0 (never) on a software device with linearq_sg8, which
// beats the tiles there at every size (lavapipe, 4096×4096, Q8_0: 0.45 s against 0.61 s at 64
// rows, 1.98 s against 2.45 s at 256). VOXPIPE_VULKAN_TILE_ROWS overrides it (0: never), to
// find where tiles start to pay on a GPU: a product of few rows makes few tiles, and a large
// GPU may then do better with a workgroup per pair of W rows.
func tileRowsPolicy(info DeviceInfo) (int64, error) {
	v := os.Getenv("VOXPIPE_VULKAN_TILE_ROWS")
	if v == "" {
		if lqOneSubgroup(info) {
			return 0, nil
		}
		return lqTiledRows, nil
	}
	n, err := strconv.ParseInt(v, 10, 32)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("vulkan: VOXPIPE_VULKAN_TILE_ROWS=%q: the fewest x rows that take Linear's tiled shader (0: never; unset: %d)", v, lqTiledRows)
	}
	return n, nil
}

// LinearPaths says in one line how Linear runs on the device: the choices of int8DotPolicy,
// tileRowsPolicy and halfTilesPolicy (for a log line when a model opens the device).
func (d *Device) LinearPaths() string {
	onOff := map[bool]string{false: "off", true: "on"}
	tiles := "never"
	if d.tileRow > 0 {
		tiles = fmt.Sprintf("from %d rows (binary16 %s)", d.tileRow, onOff[d.half])
	}
	return fmt.Sprintf("Linear: int8 dot products %s, tiles %s", onOff[d.int8Dot], tiles)
}

// Int8Dot reports whether the device's Q8_0 products of up to 8 rows round x to int8 and
// sum in integer dot products (see int8DotPolicy).
func (d *Device) Int8Dot() bool { return d.int8Dot }

// Close waits for the device and frees its programs, buffers and pipelines; closing or
// freeing one of them afterwards does nothing, and new ones are refused (ErrClosed). Nothing
// else may use the device while it closes.
func (d *Device) Close() {
	d.liveMu.Lock()
	if d.closed {
		d.liveMu.Unlock()
		return
	}
	d.closed = true
	progs, bufs := d.progs, d.bufs
	d.progs, d.bufs = nil, nil
	d.liveMu.Unlock()
	for p := range progs {
		p.free()
	}
	for b := range bufs {
		b.free()
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.d == nil {
		return
	}
	for _, p := range d.pipes {
		C.vxk_pipeline_free(d.d, p.p)
	}
	C.vxk_close(d.d)
	d.d, d.pipes = nil, nil
}

// ErrDeviceLost is in the error of every submission (a run, a copy, a new buffer's zeroing)
// once the device is lost: the driver said so, or a submission never finished. A lost device
// does not come back; the model must be opened again (on another device, or the CPU).
var ErrDeviceLost = errors.New("device lost")

// Lost reports whether the device is lost (see ErrDeviceLost).
func (d *Device) Lost() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.d != nil && C.vxk_lost(d.d) != 0
}

func (d *Device) errorf(what string, e *C.char) error {
	if C.vxk_lost(d.d) != 0 {
		return fmt.Errorf("vulkan: %s on %s: %w (%w)", what, d.Info.Name, cerr(e), ErrDeviceLost)
	}
	return fmt.Errorf("vulkan: %s on %s: %w", what, d.Info.Name, cerr(e))
}

// Buffer is device memory: host-visible ones are mapped (Float32s), device-local ones are
// reached by copies (Upload, Download).
type Buffer struct {
	dev  *Device
	b    *C.vxk_buf
	host bool
}

// Alloc makes a buffer of n float32 values: host-visible (inputs, outputs, staging) or
// device-local (weights and intermediates on a discrete GPU).
func (d *Device) Alloc(n int, host bool) (*Buffer, error) {
	if n < 0 {
		return nil, fmt.Errorf("vulkan: buffer of %d values", n)
	}
	if m := d.Info.MaxBufferBytes; m > 0 && uint64(4*n) > m {
		// Shaders bind whole buffers: a larger one could not be read by any of them.
		return nil, fmt.Errorf("vulkan: buffer of %d bytes on %s, whose shaders bind at most %d (maxStorageBufferRange)", 4*n, d.Info.Name, m)
	}
	e := errBuf()
	defer C.free(unsafe.Pointer(e))
	b := (*C.vxk_buf)(C.calloc(1, C.sizeof_vxk_buf))
	h := C.int(0)
	if host {
		h = 1
	}
	if d.isClosed() {
		C.free(unsafe.Pointer(b))
		return nil, ErrClosed
	}
	if C.vxk_alloc(d.d, C.uint64_t(4*n), h, b, e) != 0 {
		C.free(unsafe.Pointer(b))
		return nil, d.errorf(fmt.Sprintf("alloc of %d bytes", 4*n), e)
	}
	d.count(int64(b.size), host)
	buf := &Buffer{dev: d, b: b, host: host}
	if !d.track(buf, nil) { // closed meanwhile
		buf.free()
		return nil, ErrClosed
	}
	return buf, nil
}

// Len is the buffer's length in float32 values.
func (b *Buffer) Len() int { return int(b.b.size) / 4 }

// Float32s is a host-visible buffer's memory (nil for a device-local one).
func (b *Buffer) Float32s() []float32 {
	if b.b._map == nil {
		return nil
	}
	return unsafe.Slice((*float32)(b.b._map), b.Len())
}

// CopyTo copies the buffer's first n values into dst on the device.
func (b *Buffer) CopyTo(dst *Buffer, n int) error { return b.CopyRange(0, dst, 0, n) }

// CopyRange copies n values from value from of b to value to of dst on the device.
func (b *Buffer) CopyRange(from int, dst *Buffer, to, n int) error {
	if from < 0 || to < 0 || n < 0 {
		return fmt.Errorf("vulkan: copy of %d values from %d to %d", n, from, to)
	}
	if b.b == nil || dst.b == nil {
		return errors.New("vulkan: copy from or to a freed buffer")
	}
	e := errBuf()
	defer C.free(unsafe.Pointer(e))
	if C.vxk_copy(b.dev.d, b.b, C.uint64_t(4*from), dst.b, C.uint64_t(4*to), C.uint64_t(4*n), e) != 0 {
		return b.dev.errorf("copy", e)
	}
	return nil
}

// Free releases the buffer.
func (b *Buffer) Free() {
	if b.dev.untrack(b, nil) {
		b.free()
	}
}

// free releases the buffer's memory; its caller has taken it off the device's live list.
func (b *Buffer) free() {
	if b.b != nil {
		b.dev.count(-int64(b.b.size), b.host)
		C.vxk_free(b.dev.d, b.b)
		C.free(unsafe.Pointer(b.b))
		b.b = nil
	}
}

// pipeline is one compiled shader with its buffer count and push-constant size.
type pipeline struct {
	p          *C.vxk_pipe
	nbuf, push int
}

// shader returns the pipeline of a shader in spv/, compiling it on first use.
func (d *Device) shader(name string, nbuf, push int) (*pipeline, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if p, ok := d.pipes[name]; ok {
		return p, nil
	}
	code, err := spirv.ReadFile("spv/" + name + ".spv")
	if err != nil {
		return nil, fmt.Errorf("vulkan: no shader %q", name)
	}
	p, err := d.pipelineFrom(name, code, nbuf, push)
	if err != nil {
		return nil, err
	}
	d.pipes[name] = p
	return p, nil
}

// pipelineFrom compiles SPIR-V code (the bytes are copied to C memory).
func (d *Device) pipelineFrom(name string, code []byte, nbuf, push int) (*pipeline, error) {
	e := errBuf()
	defer C.free(unsafe.Pointer(e))
	if len(code) == 0 {
		return nil, fmt.Errorf("vulkan: shader %s: no SPIR-V", name)
	}
	cc := C.CBytes(code)
	defer C.free(cc)
	p := C.vxk_pipeline(d.d, (*C.uint32_t)(cc), C.size_t(len(code)), C.int(nbuf), C.int(push), e)
	if p == nil {
		return nil, d.errorf("shader "+name, e)
	}
	return &pipeline{p: p, nbuf: nbuf, push: push}, nil
}
