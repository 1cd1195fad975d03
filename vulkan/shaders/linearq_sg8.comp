#version 450
#extension GL_EXT_control_flow_attributes : require
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_arithmetic : require
// Linear over encoded weights, a workgroup of one subgroup of 8 (see linearq.glsl): for
// software devices, where barriers are dear.
#define ONE_SUBGROUP
#include "linearq.glsl"
