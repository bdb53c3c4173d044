# install(EXPORT) so that other CMake projects can find_package(Starling) and link starling::starling.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)
install(TARGETS starling starling_options EXPORT StarlingTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY include/starling DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY ${CMAKE_BINARY_DIR}/generated/starling DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
  FILES_MATCHING PATTERN "*.h")
install(EXPORT StarlingTargets NAMESPACE starling:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/Starling)
configure_package_config_file(cmake/StarlingConfig.cmake.in
  ${CMAKE_BINARY_DIR}/StarlingConfig.cmake INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/Starling)
write_basic_package_version_file(${CMAKE_BINARY_DIR}/StarlingConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/StarlingConfig.cmake ${CMAKE_BINARY_DIR}/StarlingConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/Starling)
