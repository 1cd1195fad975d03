#version 450
#extension GL_EXT_control_flow_attributes : require
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
// Linear over encoded weights for many x rows, in 64×64 tiles of binary16 summed in fp32
// (see linearq_tiled.glsl); needs shaderFloat16.
#define HALF_TILES
#include "linearq_tiled.glsl"
