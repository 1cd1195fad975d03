#version 450
#extension GL_EXT_control_flow_attributes : require
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_EXT_spirv_intrinsics : require
// Linear over encoded weights, summed by subgroup additions, Q8_0 by int8 dot products of
// x rounded to int8 (see linearq.glsl).
#define SUBGROUP_SUM
#define INT8_DOT
#include "linearq.glsl"
