#version 450
#extension GL_EXT_control_flow_attributes : require
#extension GL_GOOGLE_include_directive : require
// Linear over encoded weights for many x rows, in 64×64 tiles of fp32 (see linearq_tiled.glsl).
#include "linearq_tiled.glsl"
