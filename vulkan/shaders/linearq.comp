#version 450
#extension GL_EXT_control_flow_attributes : require
#extension GL_GOOGLE_include_directive : require
// Linear over encoded weights, summed by a shared-memory tree (see linearq.glsl).
#include "linearq.glsl"
