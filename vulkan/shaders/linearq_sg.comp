#version 450
#extension GL_EXT_control_flow_attributes : require
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_arithmetic : require
// Linear over encoded weights, summed by subgroup additions (see linearq.glsl).
#define SUBGROUP_SUM
#include "linearq.glsl"
